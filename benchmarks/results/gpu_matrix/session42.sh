#!/usr/bin/env bash
# The next session's device commands (prepared in session 41), one phase each, straight after
# one another (the machine must stay warm: /tmp/keep and the jobs live on it).
#   0 (S 60):  carry .whl data/c10, lean tree (lean_tree.sh): wheels, the full CIFAR-10 in
#      /tmp/keep; returns at once.
#   1 (S 480): issue 44 item 2's "<= 30 H200-minutes". Session 41 measured the CCT supernet alone
#      on an H100: 6.8 s per "full" epoch and 18.4 s per "shrink" epoch after compilation (60 +
#      90 epochs: about 2,120 s), the two eager random subnets of each sandwich step being most of
#      a shrink epoch. `--compile-scope subnets` runs them as one compiled masked graph
#      (ViTSupernet.forward_masked, CPU-tested equal to the sliced subnets; cuDNN autotuning on
#      with it, `--cudnn-benchmark auto`, as for a standalone network). Its 6-epoch run (2
#      full + 4 shrink) with CUDA graphs (reduce-overhead, safe since session 41's gradient fix;
#      the default mode only if that fails); per-epoch seconds from the history, as session 41.
#      Rule, written before the run (printed by the phase): adopt the setting for the supernet if
#      its steady shrink epoch (median of epochs 5-6) is <= 14.9 s (the full run then fits
#      1,800 s with session 41's full-stage speed and compile overhead) and its 6-epoch largest /
#      smallest top-1 are within 1 point of session 41's cctsnspeed6 (65.50 / 58.35).
#   2 (S 560), repeated: only if the rule holds, the full 150-epoch supernet with that setting
#      (CCT_SPEED below), returning its parts each time (carry data/cct_resume on a new machine).
#   3 (S 300): the matrix cells that train on the GPU (train/*) after session 41's train.py
#      changes (the gradient copy under CUDA graphs, compile scope "subnets").
#   bash benchmarks/results/gpu_matrix/session42.sh PHASE SECONDS [CCT_SPEED for phase 2]
set -u
PHASE=$1; S=${2:-560}
. benchmarks/results/gpu_matrix/device_env.sh || exit 1
speed_of() {  # speed_of JOB: the history's seconds per epoch
  cp /tmp/cct/$1/train_log.json /tmp/res/$1.train_log.json 2>/dev/null
  python3 -c "
import json
h = json.load(open('/tmp/cct/$1/train_log.json'))['history']; p = 0
for e in h: print(e['stage'], e['epoch'], round(e['seconds'] - p, 1), end='; '); p = e['seconds']
" 2>&1 | tail -c 400
}
case $PHASE in
0)
  nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv,noheader
  exit 0
  ;;
1)
  # CUDA graphs first (session 41: the faster full stage); the default mode only if it fails
  for j in cctsnmaskg6 cctsnmask6; do
    sp="--compile --compile-scope subnets"
    case $j in cctsnmaskg*) sp="--compile reduce-overhead --compile-scope subnets" ;; esac
    CCT_SPEED="$sp" CCT_JOBS="$j" RETURN_CKPT="none" \
      bash benchmarks/results/supernet_cifar10/h200_cct.sh 4 > /tmp/res/cct_$j.log 2>&1
    echo "$j ($sp): $(speed_of $j)"
    tail -c 600 /tmp/cct/$j.log | tr '\r' '\n' | tail -3
    python3 - "$j" <<'PY'
import json, statistics, sys
j = sys.argv[1]
try:
    h = json.load(open(f"/tmp/cct/{j}/train_log.json"))["history"]
    top = {s["role"]: s["top1"] for s in json.load(open(f"/tmp/cct/{j}/eval.json"))["subnets"]}
except (OSError, KeyError, ValueError) as e:
    print(f"rule: {j} has no result ({e})"); sys.exit(1)
sec = [b["seconds"] - a["seconds"] for a, b in zip(h, h[1:])]
shrink = statistics.median(sec[-2:])          # epochs 5-6: after the sandwich stage compiled
ok = shrink <= 14.9 and abs(top["largest"] - 65.50) <= 1 and abs(top["smallest"] - 58.35) <= 1
print(f"rule: shrink epoch {shrink:.1f} s (<= 14.9), largest {top['largest']} (65.50 +- 1), "
      f"smallest {top['smallest']} (58.35 +- 1): {'PASS' if ok else 'FAIL'}")
PY
    [ -f /tmp/cct/$j/eval.json ] && break
  done
  ;;
2)
  CCT_SPEED="${3:---compile reduce-overhead --compile-scope subnets}" CCT_JOBS="cctsn150m" RETURN_CKPT="cctsn150m" \
    bash benchmarks/results/supernet_cifar10/h200_cct.sh $(( ($(left) - 60) / 60 )) > /tmp/res/cct_phase2.log 2>&1
  grep -a -A8 "^== cctsn150m" /tmp/res/cct_phase2.log | cut -c1-600
  ;;
3)
  C="train/cct/cifar10/graphed-subnets train/mbv3/cifar10/resume-after-kill train/mbv3/digits/sandwich train/vit/cifar10/standalone-compiled"
  CELL_TIMEOUT=200 matrix $(( $(left) - 60 )) --rerun $C --only $C
  ;;
esac
tar -czf "$OUT/results.tgz" -C /tmp/res .
