#!/usr/bin/env bash
# The next session's device commands (nvidia-h100-x1 or nvidia-h200), one phase each, straight
# after one another (the machine must stay warm: /tmp/keep, /tmp/res and the background jobs
# live on it). Make the tree lean first (benchmarks/results/gpu_matrix/lean_tree.sh; restore
# with git checkout -- .):
#   1 (S 400): carry .whl data/c10 (lean tree): the CCT step probe, ALONE on the GPU (session
#      36's --compile-scope step and CUDA graphs; fp32, as the CCT-7 run will use; the most
#      telling variants first)
#   2 (S 500): no carry, the tree with supernet/checkpoints/*.pt: the cells still open, 300 s each
#      (the bits cells now run 6 trials: the Hessian seeds run only when a trial runs them):
#      run/fbnet/cifar10/bits (session 36: its export ran out of the cell's 200 s),
#      run/mbv3/digits/bits and export/mbv3 (not re-run after session 35's export change; the
#      new cuda-adaround cell); then the sensitivity probe (hessian_depthwise_probe.py:
#      PyTorch's per-channel double backward against the first-order Function used off the CPU)
#   3 (S 560): no carry: the 25,000-image mbv3 CIFAR-10 timing ALONE (issue 43 item 3: never
#      measured without other GPU jobs); then the background jobs (ResNet-20 seed 1, the
#      calibration's noise; CCT-2 fp32 seed 1 with the probe's fastest clean compile setting)
#      and quant_peers for the largest subnet on this Xeon (issue 49; fp32 and hwnas int8 only,
#      so that it fits); the jobs' resumable checkpoints come back.
#   170 s start + 400 + 500 + 560 = 1,630 s of the 1,800.
# Unfinished jobs: commit their returned parts under benchmarks/results/supernet_cifar10/resume/
# (cct2drop32s1.ckpt.part00, r20_q75_s1.checkpoint.pt, cct_logs.tgz from results.tgz).
# Session 38: CCT-7 fp32 (h200_cct.sh job cct7drop32, CCT_SPEED from the probe) started in its
# first command, alone: 200 epochs need about 6,700 images/s to fit one session.
#   bash benchmarks/results/gpu_matrix/session37.sh PHASE SECONDS
set -u
PHASE=$1; S=${2:-520}
. benchmarks/results/gpu_matrix/device_env.sh || exit 1
speed() {  # the compile flags of the probe's fastest CCT-7 variant whose augmentation is clean
  python3 - <<'PY'
import json
try:
    d = json.load(open("/tmp/res/cct_speed_probe.json"))
except OSError:
    print("--compile"); raise SystemExit
chk = d.get("augment_check", {}).get("compiled_device_vs_eager_device", {})
clean = chk.get("pixels_differing") == 0
rows = [r for r in d.get("rows", []) if r.get("role") == "largest" and "images_per_s" in r
        and r.get("variant") != "before" and (clean or r.get("compile_scope") != "step")]
best = max(rows, key=lambda r: r["images_per_s"], default=None)
if best is None or best["compile"] is None:
    print("--compile" if best is None else "")
else:
    print(f"--compile {best['compile']} --compile-scope {best['compile_scope']}")
PY
}
case $PHASE in
1)
  timeout 330 python3 benchmarks/results/supernet_cifar10/cct_speed_probe.py --device cuda \
    --precision fp32 --budget-s 240 --json /tmp/res/cct_speed_probe.json > /tmp/res/cct_speed_probe.log 2>&1
  grep -a "^|" /tmp/res/cct_speed_probe.log | cut -c1-200
  echo "fastest clean setting: $(speed)"
  ;;
2)
  sub25
  C="run/fbnet/cifar10/bits run/mbv3/digits/bits export/mbv3"
  CELL_TIMEOUT=300 matrix 150 --rerun $C --only $C
  HWNAS_SHARED_DATA=/tmp/sub25 timeout $(( $(left) - 50 )) python3 benchmarks/hessian_depthwise_probe.py --device cuda \
    --out /tmp/res/hessian_probe.json > /tmp/res/hessian_probe.log 2>&1; tail -3 /tmp/res/hessian_probe.log | cut -c1-300
  ;;
3)
  ( cd /tmp && HWNAS_SHARED_DATA=/tmp/sub25 timeout 330 python3 -m hwnas run --space mbv3 --dataset cifar10 \
      --trials 20 --device cuda --out /tmp/t25 --name r --overwrite ) > /tmp/res/timing_mbv3_cifar10.log 2>&1
  sed -i 's/\r/\n/g' /tmp/res/timing_mbv3_cifar10.log
  grep -a "sensitivity seeds\|new by this process\|exported .* in\|wall time\|stages\|trained" /tmp/res/timing_mbv3_cifar10.log
  echo "refjob r20_q75_s1 skipped: CCT-7 instead"  # session 37: CCT-7 fitted (probe: 15,651 images/s)
  CCT_SPEED="$(speed)" CCT_JOBS="cct7drop32" RETURN_CKPT="" \
    bash benchmarks/results/supernet_cifar10/h200_cct.sh 0 > /tmp/res/cct_start3.log 2>&1
  grep -a "cct7drop32" /tmp/res/cct_start3.log | head -2
  ( OMP_NUM_THREADS=8 timeout $(( $(left) - 60 )) python3 benchmarks/quant_peers.py --data /tmp/keep/cifar10-jpeg.npz \
      --subnets largest --methods fp32,hwnas_int8 --runtimes ort --timing-rounds 3 \
      --out /tmp/res/quant_peers_xeon_largest.json ) >> /tmp/res/quant_peers_xeon.log 2>&1
  grep -a "subnet=\|quantized in" /tmp/res/quant_peers_xeon.log | cut -c1-300
  ;;
esac
# the jobs: results when done, else their resumable checkpoints
CCT_SPEED="$(speed)" CCT_JOBS=none RETURN_CKPT="cct7drop32" \
  bash benchmarks/results/supernet_cifar10/h200_cct.sh 0 > /tmp/res/cct_collect$PHASE.log 2>&1
mv "$OUT/cct_logs.tgz" /tmp/res/ 2>/dev/null
grep -a -A3 "^== cct7drop32" /tmp/res/cct_collect$PHASE.log | cut -c1-300
return_jobs r20_q75_s1
