#!/usr/bin/env bash
# Make the checkout lean for a device carry (64 MiB with the carried folders): delete the large
# tracked files the device commands do not need. Args: path prefixes to keep (e.g.
# supernet/checkpoints, benchmarks/results/supernet_cifar10/resume). Restore: git checkout -- .
cd "$(git rev-parse --show-toplevel)" || exit 1
keep=("$@")
git ls-files -z | xargs -0 du -b | while read -r size f; do
  case "$f" in benchmarks/gpu_matrix.json|latency/*) continue ;; esac
  for k in "${keep[@]}"; do case "$f" in "$k"*) continue 2 ;; esac; done
  case "$f" in
    supernet/checkpoints/*.pt) rm -f "$f" ;;
    benchmarks/results/*)
      case "$f" in benchmarks/results/gpu_matrix/*.sh|benchmarks/results/gpu_matrix/*.py|benchmarks/results/supernet_cifar10/*.sh|benchmarks/results/supernet_cifar10/*.py) ;; *) rm -f "$f" ;; esac ;;
    benchmarks/*.json|benchmarks/*.md|notebooks/*|docs/*) [ "$size" -gt 8000 ] && rm -f "$f" ;;
  esac
done
git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1
