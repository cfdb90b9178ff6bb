#!/usr/bin/env bash
# Sourced by a session's device script (session35.sh onwards) on the GPU machine, in the
# repository root, with S (the command's seconds) set: the carried wheels installed once into
# /tmp/site, hwnas installed editable, the full CIFAR-10 npz kept in /tmp/keep (carried once as
# data/c10), and helpers: left (seconds left of S), matrix BUDGET ARGS... (the GPU matrix,
# 3 cells at a time, resuming from the last results of this machine or of the repository),
# bg NAME CMD (a background job in /tmp/jobs) and refjob NAME ARGS (a jpeg_reference.py job).
export PYTHONUNBUFFERED=1
if [ ! -d /tmp/site/optuna ]; then
  if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
  else  # hwnas train and the train cells do not import optuna; the search cells need it
    echo "no .whl carried and none installed: optuna is absent (train cells run, search cells fail)"
  fi
fi
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
mkdir -p /tmp/keep /tmp/res
if [ ! -f /tmp/keep/cifar10-jpeg.npz ]; then
  cp data/c10/cifar10-jpeg.npz /tmp/keep/ || { echo "no CIFAR-10 on this machine: carry data/c10 (phase 1)"; exit 1; }
fi
export CCT_DATA=/tmp/keep/cifar10-jpeg.npz HWNAS_SHARED_DATA=/tmp/sub
T0=$(date +%s)
left() { echo $(( S - ($(date +%s) - T0) )); }
sub25() {  # the timing's class-stratified CIFAR-10 copy (issue 43): 25,000 + 10,000 images
  python3 - <<'PY'
import sys; sys.path.insert(0, "benchmarks")
from pathlib import Path
from gpu_matrix import stratified_subset
dst = Path("/tmp/sub25/cifar10/cifar10-jpeg.npz")
if not dst.exists():
    stratified_subset(Path("/tmp/keep/cifar10-jpeg.npz"), dst, 2500, 1000)
PY
}
matrix() {  # matrix BUDGET ARGS...: cells kept from the last results, 3 at a time (CELL_TIMEOUT s each)
  local b=$1; shift
  prev="--results benchmarks/gpu_matrix.json"; [ -f /tmp/res/gpu_matrix.json ] && prev="--results /tmp/res/gpu_matrix.json"
  [ "$b" -lt 1 ] && return
  timeout $(( b + ${CELL_TIMEOUT:-200} )) python3 benchmarks/gpu_matrix.py --out /tmp/res --budget-s "$b" --cell-timeout "${CELL_TIMEOUT:-200}" \
    --jobs 3 --work /tmp/gm --subset-from /tmp/keep/cifar10-jpeg.npz $prev "$@" 2>&1 | tee -a /tmp/res/matrix.log | tail -24
}
J=/tmp/jobs; RES=benchmarks/results/supernet_cifar10/resume
mkdir -p $J
bg() {  # bg NAME CMD...: CMD in its own process session (outlives this command) unless running
  local name=$1; shift
  if [ -f $J/$name.pid ] && kill -0 "$(cat $J/$name.pid)" 2>/dev/null; then
    echo "$name: running"; return
  fi
  echo "$name: $*" | tee -a $J/phases.log
  setsid nohup bash -c "$* >> $J/$name.log 2>&1" >/dev/null 2>&1 &
  echo $! > $J/$name.pid
}
refjob() {  # refjob NAME ARGS...: a jpeg_reference.py run, resumed from the repository's copy
  local name=$1; shift
  [ -f $J/$name/result.json ] && { echo "$name: done"; return; }
  if [ ! -f $J/$name/checkpoint.pt ] && [ -f $RES/$name.checkpoint.pt ]; then
    mkdir -p $J/$name && cp $RES/$name.checkpoint.pt $J/$name/checkpoint.pt
  fi
  bg $name python3 benchmarks/jpeg_reference.py --out $J/$name --dataset "$CCT_DATA" \
    --device cuda --compile --checkpoint-every-s 60 "$@"
}
return_jobs() {  # return_jobs NAME...: each jpeg_reference.py job's result, else its checkpoint;
  # then the logs, and /tmp/res as $OUT/results.tgz (the end of every phase)
  for name in "$@"; do
    if [ -f $J/$name/result.json ]; then cp $J/$name/result.json /tmp/res/$name.result.json
    elif [ -f $J/$name/checkpoint.pt ]; then cp $J/$name/checkpoint.pt "$OUT/$name.checkpoint.pt"; fi
    echo "== $name"; tr '\r' '\n' < $J/$name.log 2>/dev/null | tail -2 | cut -c1-300
  done
  cp $J/*.log /tmp/res/ 2>/dev/null
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
  tar -czf "$OUT/results.tgz" -C /tmp/res .
  ls -la "$OUT"
}
timing25() {  # issue 43's 25,000-image CIFAR-10 timing (sub25 first): the baseline (.base,
  # commit 26a2a79, at most 300 s) then the current code, back to back, each as its own log
  [ -d /tmp/basesite/hwnas ] || python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/basesite ./.base
  local R who pp lim; R=$(pwd)
  for who in base current; do
    pp=/tmp/site; [ $who = base ] && pp=/tmp/basesite:/tmp/site
    lim=$(( $(left) - 20 )); [ $who = base ] && lim=$(( lim > 300 ? 300 : lim ))
    ( s0=$(date +%s); cd /tmp && PYTHONPATH=$pp HWNAS_SHARED_DATA=/tmp/sub25 timeout $lim python3 -m hwnas run --space mbv3 \
        --dataset cifar10 --trials 20 --device cuda --supernet "$R/supernet/checkpoints/mbv3_cifar10.pt" \
        --out /tmp/t25$who --name r --overwrite; echo "rc $? process seconds $(( $(date +%s) - s0 ))" ) > /tmp/res/timing_$who.log 2>&1
    sed -i 's/\r/\n/g' /tmp/res/timing_$who.log
    # per-model stage seconds on the GPU (export_makespan.py reads them)
    cp /tmp/t25$who/r/export/manifest.json /tmp/res/manifest_$who.json 2>/dev/null
    echo "== $who"; grep -a "sensitivity seeds\|new by this process\|exported .* in\|wall time\|stages\|^rc" /tmp/res/timing_$who.log | cut -c1-250
  done
}
