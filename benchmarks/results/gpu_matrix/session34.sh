#!/usr/bin/env bash
# Session 34's device commands (nvidia-h200 or nvidia-h100-x1), one phase each; the machine
# must stay warm between them for phase 2 (its data stays in /tmp/keep). Make the tree lean
# first (large tracked files out; restore with git checkout) so the carry fits in 64 MiB.
#   1: carry .whl data/c10: start the two 200-epoch CCT jobs (h200_cct.sh), the training profile
#      beside the matrix, then every digits cell: the failed vit cell, the cells never run, and
#      the bits/finetune/export cells again (session 33 changed fake-quant and the reference);
#      returns the CCT checkpoints in parts (RETURN_CKPT="cct7fix cct2fix")
#   2: tree with supernet/checkpoints/*.pt, no carry: the 25,000-image mbv3 CIFAR-10 timing,
#      then the CIFAR-10 run cells, the training cells and the vit export
#   3: as 2: quant_peers on this Xeon (issue 49), the cells left, the CCT checkpoints
# Cells run --jobs 3 at a time beside the CCT jobs: pass/fail as alone, seconds upper bounds.
#   bash benchmarks/results/gpu_matrix/session34.sh PHASE SECONDS
set -u
PHASE=$1; S=${2:-520}
export PYTHONUNBUFFERED=1
if [ ! -d /tmp/site/optuna ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
mkdir -p /tmp/keep /tmp/res
[ -f /tmp/keep/cifar10-jpeg.npz ] || cp data/c10/cifar10-jpeg.npz /tmp/keep/ || exit 1
export CCT_DATA=/tmp/keep/cifar10-jpeg.npz HWNAS_SHARED_DATA=/tmp/sub
T0=$(date +%s)
left() { echo $(( S - ($(date +%s) - T0) )); }
matrix() {  # matrix BUDGET ARGS...: cells kept from the last results, --jobs 3
  local b=$1; shift
  prev="--results benchmarks/gpu_matrix.json"; [ -f /tmp/res/gpu_matrix.json ] && prev="--results /tmp/res/gpu_matrix.json"
  [ "$b" -lt 1 ] && return
  timeout $(( b + 160 )) python3 benchmarks/gpu_matrix.py --out /tmp/res --budget-s "$b" --cell-timeout 150 \
    --jobs 3 --work /tmp/gm --subset-from /tmp/keep/cifar10-jpeg.npz $prev "$@" 2>&1 | tee -a /tmp/res/matrix.log | tail -24
}
case $PHASE in
1)
  CCT_JOBS="cct7fix cct2fix" RETURN_CKPT="" \
    bash benchmarks/results/supernet_cifar10/h200_cct.sh 0 > /tmp/res/cct_start1.log 2>&1
  head -4 /tmp/res/cct_start1.log
  ( timeout 240 python3 benchmarks/results/gpu_matrix/train_profile.py /tmp/res > /tmp/res/profile.log 2>&1 ) &
  matrix $(( $(left) - 200 )) --rerun-failed --rerun run/mbv3/digits/bits run/fbnet/digits/bits run/cct/digits/bits \
    finetune export/mbv3 --only run/vit/digits/bits run/nb201/digits run/mbv3-tiny/digits run/cct/digits \
    run/mbv3/digits/bits run/fbnet/digits/bits train/mbv3/digits finetune export/mbv3
  wait
  tail -4 /tmp/res/profile.log
  V=/tmp/gm/run_vit_digits_bits/r
  if python3 -c "import json,sys; d=json.load(open('/tmp/res/gpu_matrix.json')); sys.exit(0 if any(c['id']=='run/vit/digits/bits' and c['status']!='pass' for c in d['cells']) else 1)" 2>/dev/null && [ -f "$V/supernet.pt" ]; then
    # the vit cell failed again: the same run exported with the reference on the GPU and the
    # CPU, the code trace, and the run's supernet back for the CPU
    for d in cuda cpu; do
      ( cd /tmp && timeout 90 python3 -m hwnas export "$V" --device $d --out /tmp/vit_e$d ) \
        > /tmp/res/vit_export_$d.log 2>&1; echo "export --device $d"; grep -a "trial_\|error" /tmp/res/vit_export_$d.log | cut -c1-400
    done
    OMP_NUM_THREADS=4 timeout 120 python3 benchmarks/qdq_divergence.py "$V" --select 1 \
      --out /tmp/res/vit_divergence.json > /tmp/res/vit_divergence.log 2>&1; tail -12 /tmp/res/vit_divergence.log | cut -c1-300
    cp "$V/supernet.pt" "$OUT/vit_digits_supernet.pt"; cp "$V/config.json" /tmp/res/vit_digits_config.json
  fi
  ;;
2)
  python3 - <<'PY'
import sys; sys.path.insert(0, "benchmarks")
from pathlib import Path
from gpu_matrix import stratified_subset
dst = Path("/tmp/sub25/cifar10/cifar10-jpeg.npz")
if not dst.exists():
    stratified_subset(Path("/tmp/keep/cifar10-jpeg.npz"), dst, 2500, 1000)
PY
  ( cd /tmp && HWNAS_SHARED_DATA=/tmp/sub25 timeout 300 python3 -m hwnas run --space mbv3 --dataset cifar10 \
      --trials 20 --device cuda --out /tmp/t25 --name r --overwrite ) > /tmp/res/timing_mbv3_cifar10.log 2>&1
  grep -a "sensitivity seeds\|new by this process\|exported .* in\|wall time\|trained" /tmp/res/timing_mbv3_cifar10.log
  matrix $(( $(left) - 170 )) --rerun run/mbv3/cifar10/bits run/cct/cifar10/bits run/vit/cifar10/bits \
    --only run/fbnet/cifar10 run/nb201/cifar10 run/vit/cifar10 run/mbv3/cifar10/bits run/cct/cifar10/bits export/vit train/
  ;;
3)
  ( OMP_NUM_THREADS=8 timeout $(( S / 2 )) python3 benchmarks/quant_peers.py --data /tmp/keep/cifar10-jpeg.npz \
      --subnets smallest,middle,largest --methods fp32,hwnas_int8,hwnas_w4a8,ort_minmax,ort_minmax_reduce_range \
      --runtimes ort,ort_u8u8 --timing-rounds 3 --out /tmp/res/quant_peers_xeon.json ) > /tmp/res/quant_peers_xeon.log 2>&1
  tail -25 /tmp/res/quant_peers_xeon.log
  matrix $(( $(left) - 170 )) --rerun-failed
  ;;
esac
# collect the CCT jobs; RETURN_CKPT: the checkpoints to return in parts
CCT_JOBS=none RETURN_CKPT="${RETURN_CKPT:-}" bash benchmarks/results/supernet_cifar10/h200_cct.sh 0 > /tmp/res/cct_collect$PHASE.log 2>&1
grep -a -A3 "^== cct" /tmp/res/cct_collect$PHASE.log | cut -c1-300
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
tar -czf "$OUT/results.tgz" -C /tmp/res .
ls -la "$OUT"
