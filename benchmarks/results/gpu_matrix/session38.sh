#!/usr/bin/env bash
# The next session's device commands (nvidia-h100-x1 or nvidia-h200), one phase each, straight
# after one another (the machine must stay warm: /tmp/keep, /tmp/res and the jobs live on it).
# Prepared in session 37, not yet run. Lean tree first (lean_tree.sh; restore: git checkout -- .).
#   1 (S 560): carry .whl data/c10 (lean tree): issue 44 item 2, the CCT supernet (`cct` space,
#      its recipe, DEpS: 40 % of the epochs the full network alone, then the sandwich), 150
#      epochs in fp32 as job cctsn150 of h200_cct.sh (--compile: the network's default mode; a
#      supernet's random subnets run eagerly); then the CCT augmentation check per operation
#      (cct_speed_probe.py's augment_check: which AutoAugment operation compiles differently on
#      CUDA, session 37: 14 % of the pixels) and the step probe's variants without it.
#   2 (S 560): carry .base (made by base_tree.sh: the commit issue 43 was filed against), the
#      tree with supernet/checkpoints/*.pt: the 25,000-image CIFAR-10 timing of the baseline and
#      of the current code back to back (issue 43: "each measured in one run beside its
#      baseline"; both beside the supernet job), then the GPU matrix cell
#      run/fbnet/cifar10/bits (session 37: a parity failure of its largest model) with the
#      seconds left; the supernet's checkpoint comes back at the end of every phase.
#   3 (S 560): no carry: the searched-bits cells again (session 37 made AdaRound the export's
#      default for files with a layer below 6 bits, a GPU path change), as many as fit.
#   4.. (S 560): no carry: collect cctsn150 (checkpoint parts each phase; eval.json when done).
# Estimate (session 37's probe): the full-network phase at ~15,000 images/s (60 epochs, ~180 s),
# the sandwich at ~3,000 (90 epochs, ~1,350 s): about 26 minutes of training, so phase 3 may
# not see it end; its parts (about 46 MB) must then be carried back as data/cct_resume.
#   bash benchmarks/results/gpu_matrix/session38.sh PHASE SECONDS
set -u
PHASE=$1; S=${2:-560}
. benchmarks/results/gpu_matrix/device_env.sh || exit 1
case $PHASE in
0)
  # session 38 got a machine late (device time short): phase 1 without the probe, returning at
  # once so that phase 2 (carrying .base and the shipped checkpoint) follows on the warm machine
  CCT_SPEED="--compile" CCT_JOBS="cctsn150" RETURN_CKPT="" \
    bash benchmarks/results/supernet_cifar10/h200_cct.sh 0 > /tmp/res/cct_start0.log 2>&1
  grep -a "cctsn150" /tmp/res/cct_start0.log | head -2
  sub25; nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv,noheader
  exit 0
  ;;
1)
  CCT_SPEED="--compile" CCT_JOBS="cctsn150" RETURN_CKPT="" \
    bash benchmarks/results/supernet_cifar10/h200_cct.sh 0 > /tmp/res/cct_start1.log 2>&1
  grep -a "cctsn150" /tmp/res/cct_start1.log | head -2
  timeout $(( $(left) - 90 )) python3 benchmarks/results/supernet_cifar10/cct_speed_probe.py --device cuda \
    --precision fp32 --budget-s 120 --json /tmp/res/cct_speed_probe.json > /tmp/res/cct_speed_probe.log 2>&1
  grep -a "augment_check\|^|" /tmp/res/cct_speed_probe.log | cut -c1-400
  ;;
2)
  # issue 43 item 3's timing beside its baseline, both beside the supernet job (same conditions)
  sub25
  [ -d /tmp/basesite/hwnas ] || python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/basesite ./.base
  R=$(pwd)
  for who in base current; do
    pp=/tmp/site; [ $who = base ] && pp=/tmp/basesite:/tmp/site
    ( s0=$(date +%s); cd /tmp && PYTHONPATH=$pp HWNAS_SHARED_DATA=/tmp/sub25 timeout 280 python3 -m hwnas run --space mbv3 \
        --dataset cifar10 --trials 20 --device cuda --supernet "$R/supernet/checkpoints/mbv3_cifar10.pt" \
        --out /tmp/t25$who --name r --overwrite; echo "rc $? process seconds $(( $(date +%s) - s0 ))" ) > /tmp/res/timing_$who.log 2>&1
    sed -i 's/\r/\n/g' /tmp/res/timing_$who.log
    echo "== $who"; grep -a "sensitivity seeds\|new by this process\|exported .* in\|wall time\|^rc" /tmp/res/timing_$who.log | cut -c1-200
  done
  C="run/fbnet/cifar10/bits"
  CELL_TIMEOUT=$(( $(left) - 150 )) matrix 60 --rerun $C --only $C
  ;;
3)
  # session 37 made AdaRound the export's default for files with 4-bit layers: every searched-bits
  # cell's export changed on the GPU path, so they run again (3 at a time, 300 s each)
  C="run/mbv3/cifar10/bits run/vit/cifar10/bits run/cct/cifar10/bits run/nb201/cifar10/bits run/mbv3/digits/bits run/fbnet/digits/bits export/mbv3"
  CELL_TIMEOUT=300 matrix $(( $(left) - 420 )) --rerun $C --only $C
  ;;
esac
sleep $(( $(left) > 120 ? $(left) - 120 : 0 ))
CCT_SPEED="--compile" CCT_JOBS=none RETURN_CKPT="cctsn150" \
  bash benchmarks/results/supernet_cifar10/h200_cct.sh 0 > /tmp/res/cct_collect$PHASE.log 2>&1
mv "$OUT/cct_logs.tgz" /tmp/res/ 2>/dev/null
grep -a -A3 "^== cctsn150" /tmp/res/cct_collect$PHASE.log | cut -c1-300
return_jobs
