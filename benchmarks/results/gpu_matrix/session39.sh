#!/usr/bin/env bash
# The next session's device commands, one phase each, straight after one another (the machine
# must stay warm: /tmp/keep, /tmp/site and the jobs live on it). Prepared in session 38.
#   0 (S 60):  carry .whl data/c10, lean tree (lean_tree.sh): wheels installed, the full
#      CIFAR-10 kept in /tmp/keep, the 25,000-image copy made; returns at once.
#   1 (S 560): carry .base (base_tree.sh), the tree with supernet/checkpoints/*.pt: issue 43's
#      25,000-image CIFAR-10 timing, the baseline (26a2a79) then the current code, back to back
#      and ALONE on the GPU (session 38 ran them beside the CCT supernet job: current 215 s,
#      baseline cut at 280 s).
#   2 (S 560): carry data/cct_resume (the parts session 38 returned: cctsn150 at step 30,828 of
#      52,650), lean tree: the CCT supernet resumes (h200_cct.sh restores it from the parts) and
#      its parts come back at the end.
#   3 (S 560): no carry, beside the supernet: the matrix cells whose figures predate session 36's
#      GPU training fixes or session 37's AdaRound default (train/mbv3/cifar10/{fp32,bf16,
#      resume-after-kill}, run/mbv3-tiny/digits/bits 27 images/s, ...), then the collect below.
#   4.. (S 560): no carry: collect cctsn150 (parts each phase; eval.json and supernet.pt when
#      done). The .pt (15 MB of weights) is what ships as supernet/checkpoints/cct_cifar10.pt.
#   bash benchmarks/results/gpu_matrix/session39.sh PHASE SECONDS
set -u
PHASE=$1; S=${2:-560}
. benchmarks/results/gpu_matrix/device_env.sh || exit 1
case $PHASE in
0)
  sub25; nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv,noheader
  exit 0
  ;;
1)
  timing25
  ;;
2)
  CCT_SPEED="--compile" CCT_JOBS="cctsn150" RETURN_CKPT="cctsn150" \
    bash benchmarks/results/supernet_cifar10/h200_cct.sh $(( ($(left) - 60) / 60 )) > /tmp/res/cct_phase2.log 2>&1
  grep -a -A4 "cctsn150" /tmp/res/cct_phase2.log | cut -c1-300
  ;;
*)
  if [ "$PHASE" = 3 ]; then
    C="train/mbv3/cifar10/bf16 train/mbv3/cifar10/fp32 run/mbv3-tiny/digits/bits train/mbv3/cifar10/resume-after-kill run/fbnet/cifar10/float train/vit/cifar10/standalone-compiled run/cct/cifar10/bits run/nb201/cifar10/bits run/mbv3/digits/bits run/fbnet/digits/bits"
    CELL_TIMEOUT=240 matrix $(( $(left) - 330 )) --rerun $C --only $C
  fi
  CCT_SPEED="--compile" CCT_JOBS=none RETURN_CKPT="cctsn150" \
    bash benchmarks/results/supernet_cifar10/h200_cct.sh $(( ($(left) - 60) / 60 )) > /tmp/res/cct_phase$PHASE.log 2>&1
  grep -a -A4 "^== cctsn150" /tmp/res/cct_phase$PHASE.log | cut -c1-600
  ;;
esac
tar -czf "$OUT/results.tgz" -C /tmp/res .
