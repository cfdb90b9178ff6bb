#!/usr/bin/env bash
# The next session's device commands, one phase each, straight after one another (the machine
# must stay warm: /tmp/keep, /tmp/site and the jobs live on it). Prepared in session 39.
#   0 (S 60):  carry .whl data/c10, lean tree (lean_tree.sh): wheels installed, the full
#      CIFAR-10 kept in /tmp/keep, the 25,000-image copy made; returns at once.
#   1 (S 420): carry data/cct_resume (session 39's parts: cctsn150 at step 50,894 of 52,650),
#      lean tree: the CCT supernet resumes and finishes (about 90 s of training after its
#      compilation, then --eval); returns cctsn150.supernet.pt (ships as
#      supernet/checkpoints/cct_cifar10.pt) and its eval.json in cct_logs.tgz. If it has not
#      finished, its parts come back instead: run phase 1 again with them.
#   2 (S 560): carry .base (base_tree.sh), the tree with supernet/checkpoints/*.pt: issue 43's
#      25,000-image CIFAR-10 timing, the baseline (26a2a79) then the current code, back to back,
#      alone on the GPU (session 39: 244 s and 175 s; the export's largest-first order is new).
#   3 (S 560): no carry, the tree with supernet/checkpoints/*.pt INCLUDING the new
#      cct_cifar10.pt (copy it in before this phase): the cells the shipped CCT supernet and
#      session 38's AdaRound work change (run/vit/cifar10/{float,bits}, export/vit/cifar10/cuda,
#      run/{mbv3,fbnet}/cifar10/bits, run/{vit,nb201,cct}/digits/bits,
#      export/mbv3/digits/cuda-adaround), then the cct run's own 25,000-image timing.
#   bash benchmarks/results/gpu_matrix/session40.sh PHASE SECONDS
set -u
PHASE=$1; S=${2:-560}
. benchmarks/results/gpu_matrix/device_env.sh || exit 1
case $PHASE in
0)
  sub25; nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv,noheader
  exit 0
  ;;
1)
  CCT_SPEED="--compile" CCT_JOBS="cctsn150" RETURN_CKPT="cctsn150" \
    bash benchmarks/results/supernet_cifar10/h200_cct.sh $(( ($(left) - 40) / 60 )) > /tmp/res/cct_phase1.log 2>&1
  grep -a -A6 "^== cctsn150" /tmp/res/cct_phase1.log | cut -c1-900
  ls -la "$OUT"
  ;;
2)
  timing25
  ;;
3)
  [ -f supernet/checkpoints/cct_cifar10.pt ] || { echo "no supernet/checkpoints/cct_cifar10.pt in the tree"; exit 1; }
  C="run/vit/cifar10/bits run/vit/cifar10/float export/vit/cifar10/cuda run/mbv3/cifar10/bits run/fbnet/cifar10/bits run/vit/digits/bits run/nb201/digits/bits run/cct/digits/bits export/mbv3/digits/cuda-adaround"
  CELL_TIMEOUT=240 matrix $(( $(left) - 200 )) --rerun $C --only $C
  ( s0=$(date +%s); cd /tmp && HWNAS_SHARED_DATA=/tmp/sub25 timeout $(( $(left) - 15 )) python3 -m hwnas run --space vit \
      --dataset cifar10 --trials 20 --device cuda --out /tmp/t25vit --name r --overwrite; \
      echo "rc $? process seconds $(( $(date +%s) - s0 ))" ) > /tmp/res/timing_vit.log 2>&1
  sed -i 's/\r/\n/g' /tmp/res/timing_vit.log
  grep -a "supernet\|sensitivity seeds\|new by this process\|exported .* in\|wall time\|stages\|^rc" /tmp/res/timing_vit.log | cut -c1-250
  ;;
esac
tar -czf "$OUT/results.tgz" -C /tmp/res .
