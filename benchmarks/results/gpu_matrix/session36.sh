#!/usr/bin/env bash
# The next session's device commands (nvidia-h200 or nvidia-h100-x1), one phase each, straight
# after one another (the machine must stay warm: data stays in /tmp/keep, the training jobs run
# on in the background between commands). Make the tree lean first
# (benchmarks/results/gpu_matrix/lean_tree.sh, keeping benchmarks/results/supernet_cifar10/resume
# if it exists; restore with git checkout -- .):
#   1: carry .whl data/c10 (lean tree): start the data calibration of issue 44 (ResNet-20 with
#      He et al.'s recipe on the JPEG images as stored and re-encoded at quality 50,
#      benchmarks/jpeg_reference.py) and CCT-2 in fp32 (cct2drop32: cct2drop without bf16);
#      step_probe.py (session 35's depthwise fix: sample vs sample_cudnndw, and a profile of the
#      steady step); the cells whose supernet training the fix changes
#   2: no carry, the tree with supernet/checkpoints/*.pt: the 25,000-image mbv3 CIFAR-10 timing
#      (after session 35's export and search changes), the CIFAR-10 cells they touch
#   3: no carry: quant_peers on this Xeon for the middle subnet (issue 49), alone: run it with
#      SECONDS 560 (session 35 gave it 250 s, too few: it writes its JSON once, at the end)
#   4: no carry: quant_peers for the largest subnet, the jobs collected
# Every phase returns the jobs' resumable checkpoints (CCT-2 in 15 MB parts, ResNet-20 whole,
# 2.2 MB) until they are done, then their results; results.tgz holds the logs. Commit the
# returned checkpoints of unfinished jobs under benchmarks/results/supernet_cifar10/resume/, with
# cct_logs.tgz from results.tgz (h200_cct.sh takes a resumed CCT run's run.json from it): the
# next session resumes them from the repository (session 34's parts were lost in a git-ignored
# folder).
#   bash benchmarks/results/gpu_matrix/session36.sh PHASE SECONDS
set -u
PHASE=$1; S=${2:-520}
. benchmarks/results/gpu_matrix/device_env.sh || exit 1
# J, RES, bg and refjob: device_env.sh (moved there in session 36, unchanged)
case $PHASE in
1)
  refjob r20_q75
  refjob r20_q50 --quality 50
  CCT_JOBS="cct2drop32" RETURN_CKPT="" \
    bash benchmarks/results/supernet_cifar10/h200_cct.sh 0 > /tmp/res/cct_start1.log 2>&1
  head -3 /tmp/res/cct_start1.log
  timeout 240 python3 benchmarks/results/gpu_matrix/step_probe.py /tmp/res 30 cuda > /tmp/res/step_probe.log 2>&1
  cut -c1-250 /tmp/res/step_probe.log
  C="run/fbnet/cifar10/bits run/mbv3/digits/float run/fbnet/digits/float run/mbv3-tiny/digits/float train/mbv3/digits/sandwich train/mbv3/digits/deps train/mbv3/digits/progressive"
  matrix $(( $(left) - 200 )) --rerun $C --only $C
  ;;
2)
  sub25
  ( cd /tmp && HWNAS_SHARED_DATA=/tmp/sub25 timeout 300 python3 -m hwnas run --space mbv3 --dataset cifar10 \
      --trials 20 --device cuda --out /tmp/t25 --name r --overwrite ) > /tmp/res/timing_mbv3_cifar10.log 2>&1
  sed -i 's/\r/\n/g' /tmp/res/timing_mbv3_cifar10.log
  grep -a "sensitivity seeds\|new by this process\|exported .* in\|wall time\|stages\|trained" /tmp/res/timing_mbv3_cifar10.log
  C="run/mbv3/cifar10/bits export/mbv3 run/mbv3/digits/bits run/fbnet/digits/bits"
  matrix $(( $(left) - 170 )) --rerun $C --only $C
  ;;
3|4)
  [ "$PHASE" = 3 ] && sub=middle || sub=largest
  ( OMP_NUM_THREADS=8 timeout $(( $(left) - 120 )) python3 benchmarks/quant_peers.py --data /tmp/keep/cifar10-jpeg.npz \
      --subnets $sub --methods fp32,hwnas_int8,hwnas_w4a8,ort_minmax,ort_minmax_reduce_range \
      --runtimes ort,ort_u8u8 --timing-rounds 3 --merge --out /tmp/res/quant_peers_xeon.json ) >> /tmp/res/quant_peers_xeon.log 2>&1
  grep -a "subnet=\|quantized in" /tmp/res/quant_peers_xeon.log | cut -c1-300
  ;;
esac
# the jobs: results when done, else their resumable checkpoints
CCT_JOBS=none RETURN_CKPT="cct2drop32" bash benchmarks/results/supernet_cifar10/h200_cct.sh 0 > /tmp/res/cct_collect$PHASE.log 2>&1
mv "$OUT/cct_logs.tgz" /tmp/res/ 2>/dev/null
grep -a -A3 "^== cct2drop32" /tmp/res/cct_collect$PHASE.log | cut -c1-300
return_jobs r20_q75 r20_q50
