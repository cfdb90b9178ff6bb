#!/usr/bin/env bash
# The third mbv3 CIFAR-10 supernet run, on the 2-GPU device machine (nvidia-h200-x2); see
# benchmarks/supernet_cifar10.md. Run from the repository root with data/cifar10-jpeg.npz and
# data/nb201_cifar100_accuracy.csv present:
#
#   bash benchmarks/results/supernet_cifar10/h200x2_ddp.sh 1 MINUTES   # probes, start the run
#   bash benchmarks/results/supernet_cifar10/h200x2_ddp.sh 2 MINUTES   # finish, evaluate, nb201
#
# Phase 1: the supernet trains on both GPUs (torchrun, global batch 1024 = 512 per GPU) until
# MINUTES after the start (checkpointed); with PROBES=1 first two 1-GPU probes of the sandwich
# step side by side (cuDNN autotuning on / off) choose BM. Phase 2 (same machine, right after):
# the run resumed to its end and evaluated, nothing beside it, so its epochs time cleanly; then
# 1-GPU probes of the same recipe (GPU 0: full-network stage, then sandwich) and a short nb201
# supernet training with its Kendall tau (GPU 1). COMPILE= (empty) trains eagerly. Logs and results -> $OUT/results_x2.tgz, the
# float16 supernet -> $OUT/mbv3_cifar10.pt.
set -u
PHASE=$1
MIN=$2
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=$PWD/runs/inductor TORCHINDUCTOR_COMPILE_THREADS=4
T="hwnas train --device ${DEVICE:-cuda}"   # DEVICE=cpu for a CPU check of this script
NPROC=${NPROC:-2}           # GPUs of the supernet run; NPROC=1: one process, no probes
TR="torchrun --standalone --nproc_per_node=$NPROC -m hwnas train --device ${DEVICE:-cuda}"
[ "$NPROC" = 1 ] && TR=$T
FULL=${FULL:-0.25}          # deps schedule: share of the epochs on the full network
D=data/cifar10-jpeg.npz
R=runs/c10x2
SMOKE=${SMOKE:-}            # e.g. "--limit-train 256 --limit-eval 128 --batch-size 64" (CPU check)
COMPILE=${COMPILE---compile}  # COMPILE= (empty) trains eagerly
PROBE_MIN=${PROBE_MIN:-2.3}   # minutes of each phase-1 probe (data loading and compiling included)
RECIPE="--dataset $D --space mbv3 --epochs 40 --batch-size 1024 --lr 0.8 --warmup-epochs 2 \
  --quiet --subnet-loss largest+mean $COMPILE $SMOKE"
DEPS="--schedule deps --full-fraction $FULL"   # the supernet's schedule (the probes: sandwich)
mkdir -p $R
START=$(date +%s)
left() {  # minutes until the stop time, less $1 minutes
  python3 -c "import time; print(round(max(0.05, ($START + $MIN * 60 - time.time()) / 60 - ${1:-0}), 3))"
}
echo "phase $PHASE start $(date -u +%FT%TZ) minutes $MIN" >> $R/phases.log
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt 2>&1
lscpu > $R/cpu.txt 2>&1
(while sleep 5; do
  echo "$(date +%s) $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader | tr '\n' ' ')"
done) >> $R/smi.log 2>&1 &
SMI=$!

# steady-state images/s of a run directory: epochs after the first (compile, autotuning)
rate() {
  python3 - "$1" <<'EOF'
import json, sys
h = json.load(open(sys.argv[1] + "/train_log.json"))["history"]
if len(h) < 2:
    print(0)
else:
    n = json.load(open(sys.argv[1] + "/run.json"))["settings"].get("limit_train") or 45000
    steps = n // 1024
    print(round((len(h) - 1) * steps * 1024 / (h[-1]["seconds"] - h[0]["seconds"])))
EOF
}

BM=${BM:-off}  # cuDNN autotuning (see --cudnn-benchmark); phase 1 with PROBES=1 measures both
if [ "$PHASE" = 1 ]; then
  if [ "${PROBES:-0}" = 1 ]; then
    CUDA_VISIBLE_DEVICES=0 $T $RECIPE --schedule sandwich --out $R/probe-sandwich-bm-on \
      --overwrite --cudnn-benchmark on --max-minutes $PROBE_MIN > $R/probe-sandwich-bm-on.log 2>&1 &
    P1=$!
    CUDA_VISIBLE_DEVICES=1 $T $RECIPE --schedule sandwich --out $R/probe-sandwich-bm-off \
      --overwrite --cudnn-benchmark off --max-minutes $PROBE_MIN > $R/probe-sandwich-bm-off.log 2>&1 &
    P2=$!
    wait $P1 $P2
    ON=$(rate $R/probe-sandwich-bm-on)
    OFF=$(rate $R/probe-sandwich-bm-off)
    [ "$ON" -gt "$OFF" ] && BM=on || BM=off
    echo "sandwich probe images/s: cudnn benchmark on $ON, off $OFF -> $BM" | tee -a $R/phases.log
  fi
  echo $BM > $R/cudnn_benchmark.txt
  TORCH_LOGS=recompiles $TR $RECIPE $DEPS --out $R/sn --overwrite --cudnn-benchmark $BM --half-weights \
    --eval --max-minutes $(left 0.3) > $R/sn.log 2>&1
else
  BM=$(cat $R/cudnn_benchmark.txt)
  TORCH_LOGS=recompiles $TR --out $R/sn --resume --cudnn-benchmark $BM --half-weights --eval \
    --quiet --max-minutes $(left 4.5) >> $R/sn.log 2>&1
  (  # the 1-GPU reference rates of the same recipe: its full-network stage, then a sandwich run
    [ "$NPROC" = 1 ] && exit 0
    CUDA_VISIBLE_DEVICES=0 $T $RECIPE $DEPS --out $R/probe-full --overwrite --cudnn-benchmark $BM \
      --max-minutes 1.3 > $R/probe-full.log 2>&1
    CUDA_VISIBLE_DEVICES=0 $T $RECIPE --schedule sandwich --out $R/probe-sandwich-bm-$BM \
      --overwrite --cudnn-benchmark $BM --max-minutes 1.8 > $R/probe-sandwich-bm-$BM.log 2>&1
  ) &
  P1=$!
  (
    CUDA_VISIBLE_DEVICES=$((NPROC - 1)) $T --dataset $D --space nb201 --epochs ${NB_EPOCHS:-8} --batch-size 256 --lr 0.2 \
      --warmup-epochs 1 --subnet-loss largest+mean --out $R/nb --overwrite --eval \
      --eval-unfinished --half-weights --quiet $SMOKE --max-minutes $(left 1.2) >> $R/nb.log 2>&1
    CUDA_VISIBLE_DEVICES=$((NPROC - 1)) python3 benchmarks/cifar_tools.py rank --out $R/nb --truth data/nb201_cifar100_accuracy.csv \
      --num 50 --seed 0 --split val >> $R/nb.log 2>&1
  ) &
  P2=$!
  wait $P1 $P2
  echo "probe images/s (1 GPU, steady state): full $(rate $R/probe-full), sandwich" \
       "$(rate $R/probe-sandwich-bm-$BM); 2 GPUs: see sn/train_log.json" | tee -a $R/phases.log
fi
kill $SMI 2>/dev/null
echo "phase $PHASE end $(date -u +%FT%TZ) after $(( $(date +%s) - START )) s" >> $R/phases.log

if [ -n "${OUT:-}" ]; then
  [ -f $R/sn/supernet.pt ] && cp $R/sn/supernet.pt $OUT/mbv3_cifar10.pt
  tar czf $OUT/results_x2.tgz --exclude='*.pt' --exclude=inductor $R
fi
tail -n 5 $R/*.log
cat $R/phases.log
