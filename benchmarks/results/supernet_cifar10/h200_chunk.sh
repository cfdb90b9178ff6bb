#!/usr/bin/env bash
# One command (<= 10 minutes) of the CIFAR-10 supernet benchmark on the H200 device machine;
# see benchmarks/supernet_cifar10.md. Run from the repository root with data/cifar10-jpeg.npz
# and data/nb201_cifar100_accuracy.csv present:
#
#   bash benchmarks/results/supernet_cifar10/h200_chunk.sh 1 MINUTES   # start the runs
#   bash benchmarks/results/supernet_cifar10/h200_chunk.sh 2 MINUTES   # resume, finish, evaluate
#
# Every training stops (checkpointed) MINUTES after this script started; phase 2 must follow
# phase 1 on the same machine (run directories under runs/c10, git-ignored). Phase 1: the mbv3
# supernet (DEpS schedule, mean of the sandwich losses) and the largest, smallest and random1
# subnets standalone, all 4 processes on the one GPU at once. Phase 2: the same resumed, plus a
# short nb201 supernet training and its Kendall tau against NAS-Bench-201. Logs and results
# are packed into $OUT/results.tgz, the float16 supernet into $OUT/mbv3_cifar10.pt.
set -u
PHASE=$1
MIN=$2
EPOCHS=${EPOCHS:-40}
SMOKE=${SMOKE:-}            # e.g. "--limit-train 64 --limit-eval 64" for a CPU check of this script
COMPILE=${COMPILE---compile}  # COMPILE= (empty) trains eagerly
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=$PWD/runs/inductor TORCHINDUCTOR_COMPILE_THREADS=2
T="hwnas train --device ${DEVICE:-cuda}"   # DEVICE=cpu for a CPU check of this script
D=data/cifar10-jpeg.npz
R=runs/c10
mkdir -p $R
START=$(date +%s)
left() {  # minutes until the stop time, less $1 minutes
  python3 -c "import time; print(round(max(0.05, ($START + $MIN * 60 - time.time()) / 60 - ${1:-0}), 3))"
}
echo "phase $PHASE start $(date -u +%FT%TZ) minutes $MIN epochs $EPOCHS" >> $R/phases.log
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt 2>&1
(while sleep 10; do
  echo "$(date +%s) $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader)"
done) >> $R/smi.log 2>&1 &
SMI=$!

job() {  # job NAME [args of a new run...]: start (phase 1) or resume (phase 2) the run NAME;
  # if the compiled run fails, continue it eagerly (compiling changes speed, not results)
  local name=$1
  shift
  if [ -f $R/$name/eval.json ] && grep -q '"training_completed": true' $R/$name/eval.json; then
    return 0
  fi
  if [ "$PHASE" = 1 ]; then
    $T "$@" --out $R/$name $COMPILE --eval --max-minutes $(left) >> $R/$name.log 2>&1
  else
    $T --out $R/$name --resume --eval --quiet $EXTRA --max-minutes $(left 0.4) >> $R/$name.log 2>&1
  fi || {
    echo "== retry without compile" >> $R/$name.log
    $T --out $R/$name --resume --compile off --eval --quiet $EXTRA --max-minutes $(left 0.4) >> $R/$name.log 2>&1
  }
}

COMMON="--dataset $D --space mbv3 --epochs $EPOCHS --batch-size 1024 --lr 0.8 --warmup-epochs 2 --subnet-loss mean --quiet $SMOKE"
EXTRA="--half-weights"
[ "$PHASE" = 2 ] && EXTRA="--half-weights --eval-unfinished"
job sn $COMMON --schedule deps --full-fraction 0.5 --half-weights &
P_SN=$!
EXTRA=""
for a in largest smallest random1; do
  job sa-$a $COMMON --standalone $a &
done
if [ "$PHASE" = 2 ]; then
  (
    $T --dataset $D --space nb201 --epochs ${NB_EPOCHS:-5} --batch-size 256 --lr 0.2 --warmup-epochs 1 --subnet-loss mean \
       --out $R/nb --overwrite --eval --eval-unfinished --half-weights --quiet $SMOKE \
       --max-minutes $(left 2.2) >> $R/nb.log 2>&1
    python3 benchmarks/cifar_tools.py rank --out $R/nb --truth data/nb201_cifar100_accuracy.csv --num ${NB_RANK:-50} --seed 0 \
       --split val >> $R/nb.log 2>&1
  ) &
fi
wait $P_SN
for p in $(jobs -p); do [ "$p" != "$SMI" ] && wait $p; done
kill $SMI 2>/dev/null
echo "phase $PHASE end $(date -u +%FT%TZ) after $(( $(date +%s) - START )) s" >> $R/phases.log

if [ "$PHASE" = 2 ] && [ -n "${OUT:-}" ]; then
  if [ -f $R/sn/supernet.pt ]; then
    cp $R/sn/supernet.pt $OUT/mbv3_cifar10.pt
  elif [ -f $R/sn/checkpoint.pt ]; then  # unfinished: ship its weights in float16 anyway
    python3 -c "
from supernet.train import load_checkpoint, save_checkpoint, TrainConfig
space, net, p = load_checkpoint('$R/sn/checkpoint.pt')
save_checkpoint('$OUT/mbv3_cifar10_unfinished.pt', net, space, dataset=p['dataset'],
                train_config=TrainConfig.from_dict(p['train_config']), half=True,
                extra={'step': p['train_state']['step'], 'completed': False})"
  fi
fi
if [ -n "${OUT:-}" ]; then
  tar czf $OUT/results.tgz --exclude='*.pt' --exclude=inductor $R
fi
ls -la $R $R/* | head -60
tail -n 4 $R/*.log
