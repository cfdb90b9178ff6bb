#!/usr/bin/env bash
# The vit CIFAR-10 supernet and its three standalone baselines (largest, smallest, random1), all
# four side by side on ONE H200 (device kind nvidia-h200), in chunks of one device command each
# (see benchmarks/supernet_cifar10.md, "vit"):
#
#   VIT_DATA=data/cifar10-jpeg.npz bash benchmarks/results/supernet_cifar10/h200_vit.sh 1 9.3   # start
#   VIT_DATA=data/cifar10-jpeg.npz bash benchmarks/results/supernet_cifar10/h200_vit.sh 2 9.3   # resume
#   VIT_DATA=data/cifar10-jpeg.npz LAST=1 bash benchmarks/results/supernet_cifar10/h200_vit.sh 3 9.3
#
#   VIT_PROBE_DATA=data/c10_probe.npz bash benchmarks/results/supernet_cifar10/h200_vit.sh probe 9.3
#
# PHASE probe (optional, before phase 1; about 2 minutes) measures, one job at a time and on a
# small class-balanced npz (benchmarks/cifar_tools.py subset), the training images/s of the
# supernet's full-network and sandwich steps and of the three standalone networks (eager), and
# writes the EPOCHS that fit PHASES (default 3) commands of MINUTES each into
# $VIT_RUNS/epochs.txt, which phase 1 takes when EPOCHS is not given.
# PHASE 1 starts every job afresh (--overwrite); later phases resume the run directories under
# $VIT_RUNS (default /tmp/hwnas_vit_c10: the device machine keeps /tmp while it stays warm,
# but not the working tree's ignored files). A job
# whose run directory is gone (the machine was replaced) starts afresh, and phases.log says so.
# Each job stops MINUTES after the command's start less a margin for evaluation and packaging
# (--max-minutes, checkpointed), evaluates once its training is complete (LAST=1: also when not),
# and then $OUT receives at most 6 files, each below 16 MiB:
#   vit_<RUN>_p<PHASE>.tgz   every log, run.json, train_log.json, eval.json and the GPU samples
#   vit_cifar10.pt           the finished supernet (float16 weights, the file to ship), or
#   sn_snapshot.pt           while unfinished: its current weights in float16 (not resumable)
#   vit_cifar10_snb.pt / snb_snapshot.pt   the same for job snb
#   sa-<job>.pt              each finished standalone model
# The resumable checkpoint.pt files (AdamW state: 3x the weights) stay on the machine.
#
# VIT_DATA: the cifar10-jpeg .npz. Where it is missing, the VIT_DATA.part* files a command
# carries are kept in $VIT_RUNS/data and joined there by the first training phase (the npz does
# not fit one call's 64 MiB next to the working tree: carry part00 with the probe, part01 with
# phase 1; give every phase, the probe included, VIT_DATA). Settings: EPOCHS (default: the probe's, else 200), BATCH (512), FULL (0.4, the full-network share of
# DEpS), LR, RUN (a name for the logs), JOBS (default "sn largest smallest random1"; "snb" is
# the supernet with the extra flags SNB_FLAGS, e.g. "--mixup 0.8 --cutmix 1.0" or "--teacher
# supernet/checkpoints/mbv3_cifar10.pt --teacher-weight 1.0", in $R/snb, for an
# A/B beside "sn"; "x0".."x9" are standalone recipe trials, each of XARCH (default largest) with
# its own extra flags X<i>_FLAGS, e.g. X1_FLAGS="--batch-size 128", in $R/sa-x<i>), DEVICE
# (cuda; cpu for a check of this script), SMOKE (extra flags for every job, e.g. a CPU check:
# SMOKE="--limit-train 256 --limit-eval 128 --batch-size 64" DEVICE=cpu COMPILE= EPOCHS=1),
# COMPILE (default --compile for the standalone jobs), MARGIN_SN / MARGIN_SA (minutes kept
# for evaluation and packaging, default 0.9 / 0.6), HWNAS (the command, default python3 -m hwnas,
# installed from this checkout with pip install --no-deps -e . where the machine lacks it; Optuna
# must be importable, e.g. from carried wheels on PYTHONPATH).
# Everything else is the vit space's recipe (AdamW, DEpS, TrivialAugment + crop + flip + cutout).
set -u
PHASE=${1:?usage: h200_vit.sh PHASE MINUTES}
MIN=${2:?usage: h200_vit.sh PHASE MINUTES}
R=${VIT_RUNS:-/tmp/hwnas_vit_c10}
if [ "$PHASE" = probe ]; then DATA=${VIT_PROBE_DATA:?set VIT_PROBE_DATA to a small cifar10-jpeg .npz}
else DATA=${VIT_DATA:?set VIT_DATA to the cifar10-jpeg .npz}; fi
EPOCHS=${EPOCHS:-$(cat "$R/epochs.txt" 2>/dev/null || echo 200)}
BATCH=${BATCH:-512}
FULL=${FULL:-0.4}
RUN=${RUN:-vit1}
JOBS=${JOBS:-sn largest smallest random1}
COMPILE=${COMPILE---compile}
HWNAS=${HWNAS:-python3 -m hwnas}
START=$(date +%s)
mkdir -p "$R"
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=$(cd "$R" && pwd)/inductor TORCHINDUCTOR_COMPILE_THREADS=4
log() { echo "$*" | tee -a "$R/phases.log"; }
left() {  # minutes until the stop time, less $1 minutes
  python3 -c "import time; print(round(max(0.05, ($START + $MIN * 60 - time.time()) / 60 - $1), 3))"
}

if [ "$HWNAS" = "python3 -m hwnas" ] && ! python3 -c "import hwnas.supernet.train" 2>/dev/null; then
  # a bare device machine
  python3 -m pip install -q --no-deps --no-build-isolation -e . > "$R/install.log" 2>&1 \
    || { log "hwnas is not installed and pip install -e . failed (see $R/install.log)"; exit 2; }
fi
# parts of VIT_DATA that this command carried go to $R/data, which outlives the command (the
# working tree's ignored files do not); the training phases join them there when VIT_DATA is absent
STORE="$R/data"
if [ -n "${VIT_DATA:-}" ] && [ ! -f "$VIT_DATA" ]; then
  mkdir -p "$STORE"
  for part in "$VIT_DATA".part*; do [ -f "$part" ] && cp "$part" "$STORE/"; done
  if [ "$PHASE" != probe ]; then
    DATA="$STORE/$(basename "$VIT_DATA")"
    if [ ! -f "$DATA" ] && ls "$DATA".part* >/dev/null 2>&1; then
      cat $(ls "$DATA".part* | sort) > "$DATA.tmp" && mv "$DATA.tmp" "$DATA"
      log "joined $(ls "$DATA".part* | wc -l) parts into $DATA ($(stat -c %s "$DATA") bytes)"
    fi
  fi
fi
[ -f "$DATA" ] || { log "no data: $DATA (nor its .part* files)"; exit 2; }
case " $JOBS " in *" snb "*)
  [ -n "${SNB_FLAGS:-}" ] || { log "job snb needs SNB_FLAGS (its extra training flags)"; exit 2; }
esac

log "$RUN phase $PHASE start $(date -u +%FT%TZ) minutes $MIN epochs $EPOCHS batch $BATCH full $FULL jobs [$JOBS]"
SMI=
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/gpu.txt" 2>&1
  (while sleep 5; do
    echo "$(date +%s) $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader | tr '\n' ' ')"
  done) >> "$R/smi.log" 2>&1 &
  SMI=$!
fi

COMMON="--device ${DEVICE:-cuda} --dataset $DATA --space vit --epochs $EPOCHS --batch-size $BATCH ${LR:+--lr $LR} --quiet ${SMOKE:-}"

if [ "$PHASE" = probe ]; then
  for job in $JOBS; do  # one at a time: each job's rate alone on the GPU
    if [ "$job" = sn ]; then
      $HWNAS train $COMMON --schedule deps --full-fraction $FULL --bench-steps ${STEPS:-30} \
        --out "$R/probe-sn" >> "$R/probe.log" 2>&1
    else
      $HWNAS train $COMMON --standalone $job --bench-steps ${STEPS:-30} --out "$R/probe-$job" \
        >> "$R/probe.log" 2>&1
    fi
  done
  [ -n "$SMI" ] && kill $SMI 2>/dev/null
  # the jobs share the GPU by time-slicing, so one epoch of all of them takes about the sum of
  # their epochs alone; EPOCHS = what fits PHASES commands less startup/eval/packaging, x 0.9
  python3 - "$R" "$FULL" "${TRAIN_IMAGES:-45000}" "${PHASES:-3}" "$MIN" "${MAX_EPOCHS:-300}" \
      $JOBS <<'EOF' | tee -a "$R/phases.log"
import json, math, sys
from pathlib import Path
root, (full, n, phases, minutes, cap) = Path(sys.argv[1]), map(float, sys.argv[2:7])
seconds_per_epoch = 0.0
for job in sys.argv[7:]:
    rows = json.loads((root / f"probe-{job}" / "bench.json").read_text())["stages"]
    rate = {r["stage"]: r["images_per_s"] for r in rows}
    if job == "sn":
        s = n * (full / rate["full"] + (1 - full) / rate["shrink"])
    else:
        s = n / rate["standalone"]
    seconds_per_epoch += s
    print(f"probe {job}: " + ", ".join(f"{k} {v:.0f} images/s" for k, v in rate.items())
          + f" -> {s:.2f} s per epoch of {n:.0f} images")
budget = phases * (minutes - 1.2) * 60 * 0.9
epochs = int(max(10, min(cap, 10 * math.floor(budget / seconds_per_epoch / 10))))
print(f"probe: all jobs {seconds_per_epoch:.2f} s per epoch -> EPOCHS={epochs} "
      f"(fits {phases:.0f} commands of {minutes} minutes)")
(root / "epochs.txt").write_text(f"{epochs}\n")
EOF
  if [ -n "${OUT:-}" ]; then
    (cd "$(dirname "$R")" && tar czf "$OUT/vit_${RUN}_probe.tgz" --exclude='*.pt' \
      --exclude=inductor --exclude='*.npz' --exclude='*.npz.part*' "$(basename "$R")")
  fi
  tail -n 12 "$R/probe.log"
  exit 0
fi

EVAL="--eval"
[ "${LAST:-0}" = 1 ] && EVAL="--eval --eval-unfinished"
start_args() {  # --overwrite in phase 1; --resume later, unless the run is gone
  if [ "$PHASE" = 1 ]; then echo --overwrite
  elif [ -f "$R/$1/run.json" ]; then echo --resume
  else echo "phase $PHASE: $R/$1 holds no run (machine replaced?); starting it afresh" \
    | tee -a "$R/phases.log" >&2; echo --overwrite
  fi
}
PIDS=""
for job in $JOBS; do
  if [ "$job" = sn ]; then
    $HWNAS train $COMMON --schedule deps --full-fraction $FULL --half-weights --out "$R/sn" \
      $(start_args sn) $EVAL --max-minutes $(left ${MARGIN_SN:-0.9}) >> "$R/sn.log" 2>&1 &
  elif [ "$job" = snb ]; then  # the same supernet with SNB_FLAGS: the B of an A/B
    $HWNAS train $COMMON --schedule deps --full-fraction $FULL $SNB_FLAGS \
      --half-weights --out "$R/snb" $(start_args snb) $EVAL --max-minutes $(left ${MARGIN_SN:-0.9}) \
      >> "$R/snb.log" 2>&1 &
  else  # a standalone network; x<i>: a recipe trial, XARCH with the extra flags X<i>_FLAGS
    arch=$job extra=
    if [[ "$job" =~ ^x[0-9]$ ]]; then flags_var="X${job#x}_FLAGS"; arch=${XARCH:-largest} extra=${!flags_var:-}; fi
    $HWNAS train $COMMON --standalone $arch $COMPILE $extra --out "$R/sa-$job" $(start_args sa-$job) \
      $EVAL --max-minutes $(left ${MARGIN_SA:-0.6}) >> "$R/sa-$job.log" 2>&1 &
  fi
  PIDS="$PIDS $!"
done
STATUS=0
for pid in $PIDS; do wait $pid || STATUS=1; done
[ -n "$SMI" ] && kill $SMI 2>/dev/null
log "phase $PHASE end $(date -u +%FT%TZ) after $(( $(date +%s) - START )) s; jobs exit status $STATUS"

# progress of each run, for planning the next command (from train_log.json)
python3 - "$R" $JOBS <<'EOF' | tee -a "$R/phases.log"
import json, statistics, sys
from pathlib import Path
root = Path(sys.argv[1])
for job in sys.argv[2:]:
    d = root / (job if job in ("sn", "snb") else f"sa-{job}")
    try:
        log = json.loads((d / "train_log.json").read_text())
    except (OSError, ValueError):
        print(f"{d.name}: no train_log.json"); continue
    hist, spe = log.get("history", []), log["total_steps"] // max(1, log["epochs"])
    per_stage = {}
    for a, b in zip(hist, hist[1:]):
        per_stage.setdefault(b["stage"], []).append(b["seconds"] - a["seconds"])
    rates = ", ".join(f"{s} {statistics.median(v):.2f} s/epoch" for s, v in per_stage.items())
    ev = ""
    if (d / "eval.json").is_file():
        ev = " | " + " ".join(f"{r['role']} {r['top1']:.2f}"
                              for r in json.loads((d / "eval.json").read_text())["subnets"])
    print(f"{d.name}: epoch {log['step'] // max(1, spe)}/{log['epochs']} "
          f"{'done' if log['completed'] else 'running'}, {log['train_seconds']:.0f} s trained, "
          f"{log['images_per_s']:.0f} images/s; median {rates or 'n/a'}{ev}")
EOF

if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/vit_${RUN}_p${PHASE}.tgz" --exclude='*.pt' --exclude=inductor --exclude='*.npz' --exclude='*.npz.part*' \
    -C "$(dirname "$R")" "$(basename "$R")"
  for sn in sn snb; do  # the supernet jobs: sn -> vit_cifar10.pt, snb -> vit_cifar10_snb.pt
    name=vit_cifar10; [ "$sn" = snb ] && name=vit_cifar10_snb
    if [ -f "$R/$sn/supernet.pt" ]; then
      cp "$R/$sn/supernet.pt" "$OUT/$name.pt"
    elif [ -f "$R/$sn/checkpoint.pt" ] && [ "${SNAPSHOT:-1}" = 1 ]; then
      python3 - "$R/$sn/checkpoint.pt" "$OUT/${sn}_snapshot.pt" <<'PYEOF'
import sys
from hwnas.supernet.train import TrainConfig, load_checkpoint, save_checkpoint
space, net, p = load_checkpoint(sys.argv[1])
save_checkpoint(sys.argv[2], net, space, dataset=p["dataset"], half=True,
                train_config=TrainConfig.from_dict(p["train_config"]),
                data_record=p.get("data_record"), extra={"step": p["train_state"]["step"]})
PYEOF
    fi
  done
  for job in $JOBS; do
    [ "$job" != sn ] && [ "$job" != snb ] && [ -f "$R/sa-$job/model.pt" ] && cp "$R/sa-$job/model.pt" "$OUT/sa-$job.pt"
  done
  for f in "$OUT"/*; do  # one call returns files of at most 16 MiB
    [ "$(stat -c %s "$f")" -gt 16777216 ] && { log "$f is over 16 MiB: not returned"; rm -f "$f"; }
  done
  ls -l "$OUT"
fi
tail -n 2 "$R"/*.log
exit $STATUS
