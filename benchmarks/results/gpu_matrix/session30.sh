#!/usr/bin/env bash
# Session 30's device commands (kind nvidia-h200), one phase each; the machine must stay warm
# between them (the CCT jobs run in the background across phases, data stays in /tmp/keep).
#   1: carry .whl data/c10 (lean tree): start ablations D-G; cuDNN probe (CIFAR-10); matrix bits cells on digits
#   2: carry data/cct_resume (+ mbv3_cifar10.pt in the tree): resume cct7/cct2; mbv3 CIFAR-10 timing; matrix mbv3 cifar10
#   3: the whole tree: matrix vit cifar10, finetune/export/train cells; collect the CCT jobs' checkpoints
set -u
PHASE=$1; S=${2:-300}
export PYTHONUNBUFFERED=1
if [ ! -d /tmp/site/optuna ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site
pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
mkdir -p /tmp/keep /tmp/res
[ -f /tmp/keep/cifar10-jpeg.npz ] || cp data/c10/cifar10-jpeg.npz /tmp/keep/ || exit 1
export CCT_DATA=/tmp/keep/cifar10-jpeg.npz HWNAS_SHARED_DATA=/tmp/sub
T0=$(date +%s)
left() { echo $(( S - ($(date +%s) - T0) )); }
matrix() {  # matrix BUDGET ONLY...
  local b=$1; shift
  prev=""; [ -f /tmp/res/gpu_matrix.json ] && prev="--results /tmp/res/gpu_matrix.json"
  timeout $(( b + 160 )) python3 benchmarks/gpu_matrix.py --out /tmp/res --budget-s "$b" --cell-timeout 150 \
    --work /tmp/gm --subset-from /tmp/keep/cifar10-jpeg.npz $prev --only "$@" 2>&1 | tee -a /tmp/res/matrix.log | tail -20
}
case $PHASE in
1)
  CCT_JOBS="ablD_no_seq_pool_50 ablE_no_pos_embed_50 ablF_no_cct_norm_50 ablG_no_regularisers_50" RETURN_CKPT="" \
    bash benchmarks/results/supernet_cifar10/h200_cct.sh 0 > /tmp/res/cct_start1.log 2>&1
  matrix 1 run/mbv3/digits/bits
  timeout 200 python3 benchmarks/results/gpu_matrix/cudnn_probe.py /tmp/res cifar10 > /tmp/res/probe.log 2>&1
  matrix $(( $(left) - 170 )) run/vit/digits/bits run/cct/digits/bits run/fbnet/digits/bits run/nb201/digits/bits run/mbv3-tiny/digits/bits finetune export/mbv3
  ;;
2)
  CCT_JOBS="cct7 cct2" RETURN_CKPT="" bash benchmarks/results/supernet_cifar10/h200_cct.sh 0 > /tmp/res/cct_start2.log 2>&1
  cat /tmp/res/cct_start2.log | head
  python3 - <<'PY'
import sys; sys.path.insert(0, "benchmarks")
from pathlib import Path
from gpu_matrix import stratified_subset
dst = Path("/tmp/sub25/cifar10/cifar10-jpeg.npz")
if not dst.exists():
    stratified_subset(Path("/tmp/keep/cifar10-jpeg.npz"), dst, 2500, 1000)
PY
  ( cd /tmp && HWNAS_SHARED_DATA=/tmp/sub25 timeout 300 /usr/bin/time -v python3 -m hwnas run --space mbv3 --dataset cifar10 \
      --trials 20 --device cuda --out /tmp/t25 --name r --overwrite ) > /tmp/res/timing_mbv3_cifar10.log 2>&1
  tail -30 /tmp/res/timing_mbv3_cifar10.log | grep -v "^\s*\(Page\|Vol\|Invol\|Swap\|File\|Sock\|Sig\|Aver\|Exit\|Major\|Minor\)"
  matrix $(( $(left) - 170 )) run/mbv3/cifar10 train/mbv3/cifar10
  ;;
3)
  matrix $(( $(left) - 200 )) run/vit/cifar10/bits export/vit run/cct/cifar10 train/vit run/mbv3/digits/float run/vit/digits/float train/mbv3/digits
  ;;
esac
# collect the CCT jobs (RETURN_CKPT: the checkpoints to return in parts when not finished)
CCT_JOBS=none RETURN_CKPT="${RETURN_CKPT:-}" bash benchmarks/results/supernet_cifar10/h200_cct.sh 0 > /tmp/res/cct_collect$PHASE.log 2>&1
tail -40 /tmp/res/cct_collect$PHASE.log | grep -v "^-\|^total\|^d"
tail -4 /tmp/res/probe.log 2>/dev/null
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
tar -czf "$OUT/results.tgz" -C /tmp/res .
ls -la "$OUT"
