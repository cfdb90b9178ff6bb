#!/usr/bin/env bash
# What the shared JPEG CIFAR-10 costs (issue 44, session 35): ResNet-20 with He et al.'s recipe
# (published 91.25 %) on the npz as stored (JPEG 75, 4:2:0) and re-encoded at quality 50, side
# by side on one GPU, as resumable phases (benchmarks/jpeg_reference.py).
#
#   bash benchmarks/results/supernet_cifar10/jpeg_reference.sh MINUTES
#
# Each call starts the runs that are not running or done (in their own process sessions, so
# they outlive the call while the machine is held; a run resumes from /tmp/jpegref/NAME or from
# a checkpoint carried in data/jpeg_resume/NAME.checkpoint.pt), waits up to MINUTES, then
# returns through $OUT each run's checkpoint (about 1 MB), log and, once done, result.json.
# Needs the full cifar10-jpeg.npz at $CCT_DATA (device_env.sh: /tmp/keep) or data/c10/.
set -u
MINUTES=${1:-9}
ROOT=/tmp/jpegref
DATA=${CCT_DATA:-data/c10/cifar10-jpeg.npz}
FLAGS=${JPEGREF_FLAGS:---device cuda --bf16 --compile}  # a CPU try: "--device cpu --iterations 4"
mkdir -p "$ROOT"
export PYTHONUNBUFFERED=1
python3 -c "import hwnas.supernet" 2>/dev/null \
  || python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
# name | extra arguments
RUNS=("r20_q75|" "r20_q50|--quality 50")
for spec in "${RUNS[@]}"; do
  name=${spec%%|*}; args=${spec#*|}
  dir=$ROOT/$name
  if [ -f "$dir.pid" ] && kill -0 "$(cat "$dir.pid")" 2>/dev/null; then
    echo "$name: running"; continue
  fi
  if [ -f "$dir/result.json" ]; then echo "$name: done"; continue; fi
  if [ ! -f "$dir/checkpoint.pt" ] && [ -f "data/jpeg_resume/$name.checkpoint.pt" ]; then
    mkdir -p "$dir" && cp "data/jpeg_resume/$name.checkpoint.pt" "$dir/checkpoint.pt"
    echo "$name: resuming from the carried checkpoint"
  fi
  # --max-minutes keeps each process inside the call; the next call resumes it
  budget=$(( ${MINUTES%.*} > 1 ? ${MINUTES%.*} - 1 : 1 ))
  cmd="python3 benchmarks/jpeg_reference.py --out $dir --dataset $DATA $FLAGS \
--checkpoint-every-s 60 --max-minutes $budget $args"
  echo "$name: $cmd"
  setsid nohup bash -c "$cmd >> $dir.log 2>&1" >/dev/null 2>&1 &
  echo $! > "$dir.pid"
done
end=$(( $(date +%s) + ${MINUTES%.*} * 60 ))
while [ "$(date +%s)" -lt "$end" ]; do
  sleep 20
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader \
    >> "$ROOT/smi.log" 2>/dev/null
  running=0
  for spec in "${RUNS[@]}"; do
    d=$ROOT/${spec%%|*}; [ -f "$d.pid" ] && kill -0 "$(cat "$d.pid")" 2>/dev/null && running=1
  done
  [ "$running" = 0 ] && break
done
for spec in "${RUNS[@]}"; do
  name=${spec%%|*}
  cp "$ROOT/$name.log" "$OUT/" 2>/dev/null
  [ -f "$ROOT/$name/checkpoint.pt" ] && cp "$ROOT/$name/checkpoint.pt" "$OUT/$name.checkpoint.pt"
  [ -f "$ROOT/$name/result.json" ] && cp "$ROOT/$name/result.json" "$OUT/$name.result.json"
  echo "== $name"; tail -2 "$ROOT/$name.log" 2>/dev/null | cut -c1-600
done
cp "$ROOT/smi.log" "$OUT/" 2>/dev/null
ls -la "$OUT"
