#!/usr/bin/env bash
# Session 35's device commands (nvidia-h200 or nvidia-h100-x1), one phase each, straight after
# one another (the machine must stay warm: data stays in /tmp/keep, the CCT jobs run on in the
# background). Session 34's CCT parts were lost with its machine (git-ignored), so the CCT-2
# jobs start afresh in phase 1; CCT-7 (35 minutes alone, a 46 MB checkpoint that cannot be
# committed) waits for a session that can run it through. Make the tree lean first
# (/work/tools/lean.sh: large tracked files out; restore with git checkout) so phase 1 fits:
#   1: carry .whl data/c10 (lean tree): start cct2drop and cct2dropwd (CCT-2 with CCT's dropout
#      0.1; the second also decays every parameter, as CCT's script), step_probe.py (why GPU
#      training is slow), then the cells that need no shipped checkpoint, left or changed since
#      session 34 (fbnet bits after the float-guard fix, nb201 CIFAR-10 bits, training cells)
#   2: no carry (lean tree): the digits quantized cells again (session 34's new verification)
#   3: no carry, the tree with supernet/checkpoints/*.pt: the 25,000-image mbv3 CIFAR-10 timing,
#      the CIFAR-10 cells that use the shipped checkpoints, the vit export
#   4: no carry: quant_peers on this Xeon for the middle and largest subnets, cells left
# Every phase returns the CCT-2 checkpoints in parts while the jobs run (RETURN_CKPT), and
# their eval.json once done; results.tgz holds the CCT logs.
#   bash benchmarks/results/gpu_matrix/session35.sh PHASE SECONDS
set -u
PHASE=$1; S=${2:-520}
. benchmarks/results/gpu_matrix/device_env.sh || exit 1
case $PHASE in
1)
  CCT_JOBS="cct2drop cct2dropwd" RETURN_CKPT="" \
    bash benchmarks/results/supernet_cifar10/h200_cct.sh 0 > /tmp/res/cct_start1.log 2>&1
  head -4 /tmp/res/cct_start1.log
  timeout 200 python3 benchmarks/results/gpu_matrix/step_probe.py /tmp/res 30 cuda > /tmp/res/step_probe.log 2>&1
  cut -c1-250 /tmp/res/step_probe.log
  matrix $(( $(left) - 200 )) --rerun run/fbnet/digits/bits run/fbnet/cifar10/bits \
    --only run/fbnet/digits/bits run/fbnet/cifar10/bits run/nb201/cifar10/bits train/
  ;;
2)
  matrix $(( $(left) - 170 )) --rerun run/mbv3/digits/bits run/vit/digits/bits run/nb201/digits/bits \
    run/mbv3-tiny/digits/bits run/cct/digits/bits export/mbv3 finetune \
    --only run/mbv3/digits/bits export/mbv3 finetune run/vit/digits/bits run/nb201/digits/bits \
    run/mbv3-tiny/digits/bits run/cct/digits/bits
  ;;
3)
  sub25
  ( cd /tmp && HWNAS_SHARED_DATA=/tmp/sub25 timeout 300 python3 -m hwnas run --space mbv3 --dataset cifar10 \
      --trials 20 --device cuda --out /tmp/t25 --name r --overwrite ) > /tmp/res/timing_mbv3_cifar10.log 2>&1
  sed -i 's/\r/\n/g' /tmp/res/timing_mbv3_cifar10.log
  grep -a "sensitivity seeds\|new by this process\|exported .* in\|wall time\|trained" /tmp/res/timing_mbv3_cifar10.log
  matrix $(( $(left) - 170 )) --rerun run/mbv3/cifar10/bits run/vit/cifar10/bits run/cct/cifar10/bits \
    --only run/vit/cifar10/bits export/vit run/mbv3/cifar10/bits run/cct/cifar10/bits
  ;;
4)
  ( matrix 260 --only train/mbv3/cifar10/resume-after-kill train/vit/cifar10/standalone-compiled > /tmp/res/m4.log 2>&1 & )
  # one subnet per command, merged into one JSON (quant_peers writes at the end of a command)
  for sub in middle largest; do
    [ "$(left)" -lt 240 ] && break
    ( OMP_NUM_THREADS=8 timeout $(( $(left) - 200 )) python3 benchmarks/quant_peers.py --data /tmp/keep/cifar10-jpeg.npz \
        --subnets $sub --methods fp32,hwnas_int8,hwnas_w4a8,ort_minmax,ort_minmax_reduce_range \
        --runtimes ort,ort_u8u8 --timing-rounds 3 --merge --out /tmp/res/quant_peers_xeon.json ) >> /tmp/res/quant_peers_xeon.log 2>&1
  done
  grep -a "subnet=" /tmp/res/quant_peers_xeon.log | cut -c1-300
  matrix $(( $(left) - 170 )) --only train/mbv3/cifar10/resume-after-kill
  ;;
esac
# the CCT jobs: their eval.json when done, else their checkpoints in parts (RETURN_CKPT)
CCT_JOBS=none RETURN_CKPT="${RETURN_CKPT:-cct2drop cct2dropwd}" bash benchmarks/results/supernet_cifar10/h200_cct.sh 0 > /tmp/res/cct_collect$PHASE.log 2>&1
mv "$OUT/cct_logs.tgz" /tmp/res/ 2>/dev/null
grep -a -A3 "^== cct" /tmp/res/cct_collect$PHASE.log | cut -c1-300
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
tar -czf "$OUT/results.tgz" -C /tmp/res .
ls -la "$OUT"
