#!/usr/bin/env bash
# The issue-43 baseline as a carried folder (.base/, git-ignored): the tree of the commit before
# the GPU matrix (26a2a79, main when issue 43 was filed and its 236 s measured), without the
# checkpoints (its mbv3_cifar10.pt is the same blob as today's: pass --supernet) and the large
# folders. On the device: pip install --target a folder of its own, then run it ahead of the
# editable install on PYTHONPATH (session38.sh phase 3 runs base and current back to back).
cd "$(git rev-parse --show-toplevel)" || exit 1
BASE=${1:-26a2a79782fddbc28fd1bd5f85b1fe54f6348068}
rm -rf .base && mkdir .base
git archive "$BASE" | tar -x -C .base --exclude='*.pt' --exclude='benchmarks/results' \
  --exclude='notebooks' --exclude='docs' --exclude='tests'
du -sh .base
