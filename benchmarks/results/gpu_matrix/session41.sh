#!/usr/bin/env bash
# The next session's device commands (prepared in session 40), one phase each, straight after
# one another (the machine must stay warm: /tmp/keep and the jobs live on it).
#   0 (S 60):  carry .whl data/c10, lean tree (lean_tree.sh): wheels, the full CIFAR-10 in
#      /tmp/keep; returns at once.
#   1 (S 420): issue 44 item 2's "<= 30 H200-minutes": the CCT supernet's training speed ALONE
#      on the GPU (never measured: sessions 38-39 ran it beside other jobs). The cctsn150 recipe
#      for 6 epochs (2 "full", 4 "shrink"): the per-epoch seconds after each stage's first
#      epoch give the full run's seconds alone (60 full + 90 shrink epochs). Then the same with
#      CUDA graphs over the model (`--compile reduce-overhead --compile-scope model`, session
#      37's fastest exact setting for CCT-7 alone):
#      session 40's history puts the default at 20.3 s per epoch alone on an H100 (epochs
#      147-150), about 50 min for 150 epochs, so the 30-minute target needs about 1.7x.
#   2 (S 560): issue 44 item 1: CCT-2/3x2's third seed (session 37: 84.17 and 83.51 %, mean
#      1.06 points under its data-adjusted reference 84.90; 436 s alone on an H100). Returns
#      its parts if it has not finished: repeat phase 2 with them carried (data/cct_resume).
#   3 (S 300): carry .whl data/c10 if the machine is fresh: the matrix cells of session 40's
#      train_run.py change (a resumed run's training seconds), made after its last device command.
#   bash benchmarks/results/gpu_matrix/session41.sh PHASE SECONDS
set -u
PHASE=$1; S=${2:-560}
. benchmarks/results/gpu_matrix/device_env.sh || exit 1
case $PHASE in
0)
  nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv,noheader
  exit 0
  ;;
1)
  # 6 epochs = 2 "full" + 4 "shrink" (deps, full_fraction 0.4): the history's per-epoch seconds
  # give both stages' speed after compilation (the first epoch of each stage compiles)
  for j in cctsnspeed6 cctsnspeedg6; do
    sp="--compile"; case $j in cctsnspeedg*) sp="--compile reduce-overhead --compile-scope model" ;; esac
    CCT_SPEED="$sp" CCT_JOBS="$j" RETURN_CKPT="none" \
      bash benchmarks/results/supernet_cifar10/h200_cct.sh 4 > /tmp/res/cct_$j.log 2>&1
    cp /tmp/cct/$j/train_log.json /tmp/res/$j.train_log.json 2>/dev/null
    echo "$j ($sp): $(python3 -c "
import json, sys
h = json.load(open('/tmp/cct/$j/train_log.json'))['history']; p = 0
for e in h: print(e['stage'], e['epoch'], round(e['seconds'] - p, 1), end='; '); p = e['seconds']
" 2>&1 | tail -c 400)"
  done
  ;;
2)
  CCT_SPEED="--compile" CCT_JOBS="cct2drop32s2" RETURN_CKPT="cct2drop32s2" \
    bash benchmarks/results/supernet_cifar10/h200_cct.sh $(( ($(left) - 40) / 60 )) > /tmp/res/cct_phase2.log 2>&1
  grep -a -A8 "^== cct2drop32s2" /tmp/res/cct_phase2.log | cut -c1-600
  ;;
4)
  # phase 1's CUDA-graph run diverged at its first sandwich epoch (PyTorch issue 169545: the
  # largest's gradients, taken over from the graph's memory, overwritten by the smallest's
  # replay); the same run with the fix (train_options.CUDA_GRAPH_MODES), speed as in phase 1
  j=cctsnspeedg6; rm -rf /tmp/cct/$j /tmp/cct/$j.log /tmp/cct/$j.pid
  CCT_SPEED="--compile reduce-overhead --compile-scope model" CCT_JOBS="$j" RETURN_CKPT="none" \
    bash benchmarks/results/supernet_cifar10/h200_cct.sh $(( ($(left) - 30) / 60 )) > /tmp/res/cct_${j}_fix.log 2>&1
  cp /tmp/cct/$j/train_log.json /tmp/res/$j.fix.train_log.json 2>/dev/null
  tail -c 800 /tmp/cct/$j.log | tr '\r' '\n' | tail -4
  python3 -c "
import json
h = json.load(open('/tmp/cct/$j/train_log.json'))['history']; p = 0
for e in h: print(e['stage'], e['epoch'], round(e['seconds'] - p, 1), end='; '); p = e['seconds']
"
  ;;
3)
  C="train/mbv3/cifar10/resume-after-kill train/mbv3/digits/sandwich"
  CELL_TIMEOUT=200 matrix $(( $(left) - 60 )) --rerun $C --only $C
  ;;
esac
tar -czf "$OUT/results.tgz" -C /tmp/res .
