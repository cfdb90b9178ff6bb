#!/usr/bin/env bash
# One device command (kind nvidia-h200): start or continue the CCT jobs in the background
# (h200_cct.sh), then the cuDNN probe (once) and the GPU matrix for MATRIX_S seconds, beside them;
# everything returned through $OUT in at most 8 files. Carry .whl and, on a fresh machine,
# data/c10 (the full cifar10-jpeg.npz) and data/cct_resume (returned parts), and
# data/gm_prev (the previous gpu_matrix.json) to resume the matrix.
#   bash benchmarks/results/gpu_matrix/device_call.sh MATRIX_S [probe]
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
mkdir -p /tmp/keep /tmp/res
[ -f /tmp/keep/cifar10-jpeg.npz ] || cp data/c10/cifar10-jpeg.npz /tmp/keep/
export CCT_DATA=/tmp/keep/cifar10-jpeg.npz HWNAS_SHARED_DATA=/tmp/sub
bash benchmarks/results/supernet_cifar10/h200_cct.sh 0 > /tmp/res/cct_start.log 2>&1
[ "${2:-}" = probe ] && timeout 200 python3 benchmarks/results/gpu_matrix/cudnn_probe.py /tmp/res > /tmp/res/probe.log 2>&1
prev=""; [ -f /tmp/res/gpu_matrix.json ] && prev="--results /tmp/res/gpu_matrix.json"
[ -z "$prev" ] && [ -f data/gm_prev/gpu_matrix.json ] && prev="--results data/gm_prev/gpu_matrix.json"
timeout $(( $1 + 60 )) python3 benchmarks/gpu_matrix.py --out /tmp/res --budget-s "$1" --cell-timeout 150 \
  --work /tmp/gm --subset-from /tmp/keep/cifar10-jpeg.npz $prev 2>&1 | tee -a /tmp/res/matrix.log | tail -30
bash benchmarks/results/supernet_cifar10/h200_cct.sh 0 > /tmp/res/cct_collect.log 2>&1
tail -25 /tmp/res/cct_collect.log
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
tar -czf "$OUT/results.tgz" -C /tmp/res .
ls -la "$OUT"
