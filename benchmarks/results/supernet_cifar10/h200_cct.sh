#!/usr/bin/env bash
# CCT reproduction on one H200, as resumable phases (benchmarks/supernet_cifar10.md, "CCT").
#
#   bash benchmarks/results/supernet_cifar10/h200_cct.sh MINUTES
#
# Each call: restores every job's run directory (from /tmp if this machine ran it before, else
# from the parts a previous call returned, carried in data/cct_resume/), starts the jobs that
# are not running, in their own process session so that they outlive this call while the
# machine is held, waits MINUTES, then returns through $OUT each job's logs (cct_logs.tgz) and
# the resumable checkpoints of the main jobs, split into 15 MB parts (cct7.ckpt.partNN ...).
# Carry: data/c10 (the full cifar10-jpeg.npz) and, when resuming on a new machine,
# data/cct_resume (the returned parts) - in two commands, with CCT_JOBS=none in the first.
# Session 30's state: cct7 and cct2 (200 epochs, the cifar10.yml-like recipe and the old
# standalone init) finished at 88.34 / 82.34 %; ablations A-C are done, D-G never started (their
# run directories held the pid files). The jobs below test the fixed `cct` (CCT's structure,
# init, drop-path rates and CCT's 200-epoch recipe: benchmarks/supernet_cifar10.md, "Session
# 30"); they are listed in priority order, and CCT_JOBS picks them (default: all).
# Session 34: cct7fix / cct2fix resume with the space configuration their run.json records
# (no dropout); cct2drop / cct7drop start afresh with `cct`'s new default, CCT's dropout 0.1
# (benchmarks/supernet_cifar10.md, "Session 34"); the jobs not yet started get it too.
# Session 35: session 34's returned parts were lost with its machine (they lay in a git-ignored
# folder); cct2drop and cct2dropwd (plus CCT's weight decay on every parameter, --decay-all)
# start afresh. CCT-2's parts (about 3.5 MB) are committed when a run does not finish, so the
# next session resumes them from the repository (data/cct_resume or
# benchmarks/results/supernet_cifar10/resume/).
# Session 46: cctsnkdall200 is cctsnkd200 with every sandwich subnet learning from the teacher
# (--teacher-scope all), beside cct2kd200 / cct7kd200 (the networks trained alone with the same
# teacher); its rule is in benchmarks/supernet_cifar10.md, "Session 46". Their parts are found in
# any data/cct_resume* folder (one per carry: the supernet's 46 MB and CCT-7's do not fit one
# 64 MiB carry together) and in benchmarks/results/supernet_cifar10/resume/ (CCT-2's, committed).
# Session 48: cct2kd200 finished (84.61 %); its parts left the repository. The supernet's parts
# (46 MB) fit one carry only with the lean tree that keeps the teacher alone (lean_tree.sh
# supernet/checkpoints/mbv3).
# Session 52: cctsnkdall200 finished and failed its rule; --teacher-scope was taken out, so its job
# line is gone (its arguments would be refused). cctsnkdreg200 is cctsnkd200 with dropout and
# stochastic depth on the largest subnet only (--regularise largest, BigNAS); its rule is in
# benchmarks/supernet_cifar10.md, "Session 52".
set -u
MINUTES=${1:-9}
ROOT=/tmp/cct
DATA=${CCT_DATA:-data/c10/cifar10-jpeg.npz}
mkdir -p "$ROOT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || true
export PYTHONUNBUFFERED=1

# name | hwnas train arguments (--epochs included)
JOBS=(
  "cct7fix|--space cct --standalone largest --epochs 200"
  "cct2fix|--space cct --standalone smallest --epochs 200"
  "cct2drop|--space cct --standalone smallest --epochs 200"
  "cct2dropwd|--space cct --standalone smallest --epochs 200 --decay-all"
  "cct2drop32|--space cct --standalone smallest --epochs 200 --precision fp32"
  "cct7drop|--space cct --standalone largest --epochs 200"
  "cct7drop32|--space cct --standalone largest --epochs 200 --precision fp32"
  "cct2drop32s1|--space cct --standalone smallest --epochs 200 --precision fp32 --seed 1"
  "cctsn150|--space cct --epochs 150 --precision fp32"
  "cct2drop32s2|--space cct --standalone smallest --epochs 200 --precision fp32 --seed 2"
  "cctsnspeed2|--space cct --epochs 2 --precision fp32"
  "cctsnspeed6|--space cct --epochs 6 --precision fp32"
  "cctsnspeedg2|--space cct --epochs 2 --precision fp32"
  "cctsnspeedg6|--space cct --epochs 6 --precision fp32"
  "cctsnmask6|--space cct --epochs 6 --precision fp32"
  "cctsnmaskg6|--space cct --epochs 6 --precision fp32"
  "cctsn150m|--space cct --epochs 150 --precision fp32"
  "cctsn200m|--space cct --epochs 200 --precision fp32"
  "cctsnkd200|--space cct --epochs 200 --precision fp32 --teacher supernet/checkpoints/mbv3_cifar10.pt --teacher-weight 1.0"
  "cct2kd200|--space cct --standalone smallest --epochs 200 --precision fp32 --teacher supernet/checkpoints/mbv3_cifar10.pt --teacher-weight 1.0"
  "cct7kd200|--space cct --standalone largest --epochs 200 --precision fp32 --teacher supernet/checkpoints/mbv3_cifar10.pt --teacher-weight 1.0"
  "cctsnkdreg200|--space cct --epochs 200 --precision fp32 --teacher supernet/checkpoints/mbv3_cifar10.pt --teacher-weight 1.0 --regularise largest"
  "ablH_cct7fix_s30recipe_50|--space cct --standalone largest --epochs 50 --augment trivial_crop_flip_cutout --mixup 0.8 --cutmix 1.0 --lr 5.5e-4 --weight-decay 0.06 --warmup-epochs 10 --grad-clip 5"
  "ablI_cct7fix_50|--space cct --standalone largest --epochs 50"
  "ablJ_cct2fix_mix_200|--space cct --standalone smallest --epochs 200 --mixup 0.8 --cutmix 1.0"
  "ablD_no_seq_pool_50|--space cct-no-seq_pool --standalone largest --epochs 50"
  "ablE_no_pos_embed_50|--space cct-no-pos_embed --standalone largest --epochs 50"
  "ablF_no_cct_norm_50|--space cct-no-cct_norm --standalone largest --epochs 50"
  "ablG_no_regularisers_50|--space cct-no-regularisers --standalone largest --epochs 50"
)
# every job runs through benchmarks/cct_ablation.py: the hwnas command line with the per-part
# ablation spaces (cct-no-<part>) registered, so their runs resume like the others
HWNAS="python3 benchmarks/cct_ablation.py"
RETURN_CKPT="${RETURN_CKPT:-cct7fix cct2fix cct2drop cct7drop}"
# CCT_SPEED: how the jobs compile (speed only; session 36's cct_speed_probe.py measures the
# options): default --compile (the network, torch.compile's default mode)
CCT_SPEED="${CCT_SPEED:---compile}"

# CCT_JOBS: the names to start or resume (default: all); "none" starts nothing (a command that
# only carries data: the full npz and the 46 MB cct7 parts do not fit in one 64 MiB carry)
for spec in "${JOBS[@]}"; do
  name=${spec%%|*}; args=${spec#*|}
  dir=$ROOT/$name
  case " ${CCT_JOBS:-$name} " in *" $name "*) ;; *) continue ;; esac
  if [ -f "$dir.pid" ] && kill -0 "$(cat "$dir.pid")" 2>/dev/null; then
    echo "$name: running"; continue
  fi
  if [ -f "$dir/eval.json" ]; then echo "$name: done"; continue; fi
  for src in data/cct_resume* benchmarks/results/supernet_cifar10/resume; do
    if [ ! -f "$dir/checkpoint.pt" ] && ls "$src/$name".ckpt.part* >/dev/null 2>&1; then
      mkdir -p "$dir"
      cat "$src/$name".ckpt.part* > "$dir/checkpoint.pt"
      tar -xzf "$src/cct_logs.tgz" -C "$ROOT" --wildcards "*/$name/run.json" "*/$name/train_log.json" 2>/dev/null
      echo "$name: restored from carried parts ($src)"
    fi
  done
  if [ -f "$dir/checkpoint.pt" ] && [ -f "$dir/run.json" ]; then
    cmd="$HWNAS train --out $dir --resume --device cuda $CCT_SPEED --quiet --eval"
  else
    rm -rf "$dir"
    cmd="$HWNAS train $args --dataset $DATA --out $dir --device cuda $CCT_SPEED --quiet --eval --checkpoint-every-s 90"
  fi
  echo "$name: $cmd" | tee -a "$ROOT/phases.log"
  # the pid file beside the run directory, not in it: hwnas train refuses an --out that holds
  # files it did not write
  setsid nohup bash -c "$cmd >> $dir.log 2>&1" >/dev/null 2>&1 &
  echo $! > "$dir.pid"
done

end=$(( $(date +%s) + ${MINUTES%.*} * 60 ))
while [ "$(date +%s)" -lt "$end" ]; do
  sleep 30
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader >> "$ROOT/smi.log"
  running=0
  for spec in "${JOBS[@]}"; do
    d=$ROOT/${spec%%|*}; [ -f "$d.pid" ] && kill -0 "$(cat "$d.pid")" 2>/dev/null && running=1
  done
  [ "$running" = 0 ] && break
done

cd "$ROOT" && tar -czf "$OUT/cct_logs.tgz" phases.log smi.log ./*.log ./*/run.json ./*/train_log.json ./*/eval.json 2>/dev/null
cd - >/dev/null
# The device returns about 64 MB per command (session 46: a third large part was dropped), so
# the files go back within RETURN_MB, the run returned longest ago (or never) first: runs too
# large to go back together take turns, one per command.
RETURN_MB=${RETURN_MB:-60}; used=0
order=$(for name in $RETURN_CKPT; do
  echo "$(grep -s "^$name " "$ROOT/returned.txt" | tail -1 | cut -d' ' -f2 || true) $name"
done | sort -s -n -k1,1 | awk '{print $NF}')
give() {  # give SRC DEST...: split or copy SRC into $OUT if it fits what is left of RETURN_MB
  local mb=$(( $(stat -c %s "$1") / 1048576 + 1 ))
  [ $(( used + mb )) -gt "$RETURN_MB" ] && { echo "$1: not returned (over RETURN_MB=$RETURN_MB)"; return 1; }
  used=$(( used + mb )); "${@:2}"
}
for name in $order; do
  sent=0
  if [ -f "$ROOT/$name/checkpoint.pt" ] && [ ! -f "$ROOT/$name/eval.json" ]; then
    give "$ROOT/$name/checkpoint.pt" split -b 15M -d -a 2 "$ROOT/$name/checkpoint.pt" "$OUT/$name.ckpt.part" && sent=1
  fi
  for f in model supernet; do  # the finished network (standalone) or supernet (cctsn150)
    [ -f "$ROOT/$name/$f.pt" ] && give "$ROOT/$name/$f.pt" cp "$ROOT/$name/$f.pt" "$OUT/$name.$f.pt" && sent=1
  done
  [ "$sent" = 1 ] && echo "$name $(date +%s)" >> "$ROOT/returned.txt"
done
for spec in "${JOBS[@]}"; do
  name=${spec%%|*}
  echo "== $name"; tail -c 600 "$ROOT/$name.log" 2>/dev/null | tr '\r' '\n' | tail -4
  [ -f "$ROOT/$name/eval.json" ] && cat "$ROOT/$name/eval.json" | head -c 600
done
ls -la "$OUT"
