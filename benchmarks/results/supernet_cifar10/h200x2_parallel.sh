#!/usr/bin/env bash
# Runs 4 to 7 of the mbv3 CIFAR-10 supernet (see benchmarks/supernet_cifar10.md): the supernet and its
# three standalone baselines, all with the same number of epochs, trained side by side on the
# 2-GPU device machine (nvidia-h200-x2) in chunks of one device command each:
#
#   bash benchmarks/results/supernet_cifar10/h200x2_parallel.sh 1 MINUTES     # start
#   bash benchmarks/results/supernet_cifar10/h200x2_parallel.sh 2 MINUTES     # resume (repeat)
#
# GPU 0: the supernet (eager, one process) + the smallest subnet standalone (compiled).
# GPU 1: the largest and the random1 subnet standalone (compiled). Every job stops MINUTES after
# the command's start (checkpointed; the machine keeps runs/ while warm), evaluates once
# finished (--eval-unfinished with LAST=1), and the logs and evaluations go to $OUT each time.
# Run 4: defaults. Run 5: AUGMENT=crop_flip_cutout RUN=run5 (every job trains with 16x16 cutout).
# Run 6: AUGMENT=crop_flip_cutout RUN=run6 EPOCHS=150 FULL=0.4 (150 epochs, 60 of them full-network).
# Run 7: run 6 with AUGMENT=trivial_crop_flip_cutout RUN=run7 (TrivialAugment first).
# CPU smoke test: SMOKE="--limit-train 256 --limit-eval 128 --batch-size 64" COMPILE= EPOCHS=2
set -u
PHASE=$1
MIN=$2
EPOCHS=${EPOCHS:-100}
FULL=${FULL:-0.25}
RUN=${RUN:-run4}
AUG=${AUGMENT:+--augment $AUGMENT}
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=$PWD/runs/inductor TORCHINDUCTOR_COMPILE_THREADS=4
T="hwnas train --device ${DEVICE:-cuda}"   # DEVICE=cpu for a CPU check of this script
R=runs/c10p
START=$(date +%s)
mkdir -p $R
left() {  # minutes until the stop time, less $1 minutes
  python3 -c "import time; print(round(max(0.05, ($START + $MIN * 60 - time.time()) / 60 - ${1:-0}), 3))"
}
if [ "$PHASE" = 1 ]; then START_ARGS=--overwrite; else START_ARGS=--resume; fi
EVAL="--eval"
[ "${LAST:-0}" = 1 ] && EVAL="--eval --eval-unfinished"
echo "$RUN phase $PHASE start $(date -u +%FT%TZ) minutes $MIN epochs $EPOCHS ${AUGMENT:-}" >> $R/phases.log
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt 2>&1
(while sleep 5; do
  echo "$(date +%s) $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader | tr '\n' ' ')"
done) >> $R/smi.log 2>&1 &
SMI=$!
COMMON="--dataset data/cifar10-jpeg.npz --space mbv3 --epochs $EPOCHS --batch-size 1024 --lr 0.8 --warmup-epochs 2 --subnet-loss mean --quiet $AUG ${SMOKE:-}"
COMPILE=${COMPILE---compile}  # COMPILE= (empty): standalone eager too (CPU smoke test)
PIDS=""
CUDA_VISIBLE_DEVICES=0 $T $COMMON --schedule deps --full-fraction $FULL --subnet-loss largest+mean \
  --cudnn-benchmark off --half-weights --out $R/sn $START_ARGS $EVAL \
  --max-minutes $(left 1.2) >> $R/sn.log 2>&1 &
PIDS="$PIDS $!"
for job in 0:smallest 1:largest 1:random1; do
  CUDA_VISIBLE_DEVICES=${job%%:*} $T $COMMON --standalone ${job#*:} $COMPILE \
    --out $R/sa-${job#*:} $START_ARGS $EVAL --max-minutes $(left 0.6) >> $R/sa-${job#*:}.log 2>&1 &
  PIDS="$PIDS $!"
done
wait $PIDS
kill $SMI 2>/dev/null
echo "phase $PHASE end $(date -u +%FT%TZ) after $(( $(date +%s) - START )) s" >> $R/phases.log
if [ -n "${OUT:-}" ]; then
  [ -f $R/sn/supernet.pt ] && cp $R/sn/supernet.pt $OUT/mbv3_cifar10.pt
  tar czf $OUT/results_$RUN.tgz --exclude='*.pt' --exclude=inductor $R
fi
tail -n 3 $R/*.log
cat $R/phases.log
