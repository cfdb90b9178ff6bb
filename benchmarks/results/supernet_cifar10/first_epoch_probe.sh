#!/usr/bin/env bash
# Probe (session 6): why does the first sandwich epoch of every training process take ~60 s
# instead of 9 s (runs 4 and 5)? Four 3-epoch sandwich runs of the mbv3 supernet, two at a time
# (one per GPU of nvidia-h200-x2), each a fresh process; the per-epoch clock in
# runs/probe/<variant>/train_log.json tells the first epoch's extra cost per variant:
#   base      as runs 4 and 5 (eager, cuDNN autotuning off)
#   eager     CUDA_MODULE_LOADING=EAGER (all kernels loaded at start-up instead of on first use)
#   nocudnn   cuDNN disabled (PyTorch's own convolution kernels)
#   autotune  cuDNN autotuning on (--cudnn-benchmark on)
set -u
export PYTHONUNBUFFERED=1
R=runs/probe
mkdir -p $R
ARGS="--dataset data/cifar10-jpeg.npz --space mbv3 --epochs 3 --batch-size 1024 --lr 0.8 --quiet --schedule sandwich --subnet-loss largest+mean --warmup-epochs 0.5"
T="hwnas train --device ${DEVICE:-cuda}"   # DEVICE=cpu for a CPU check of this script
NOCUDNN="python3 -c 'import runpy, sys, torch; torch.backends.cudnn.enabled = False; sys.argv[0] = \"hwnas\"; runpy.run_module(\"hwnas\", run_name=\"__main__\")' train --device ${DEVICE:-cuda}"
run() {  # GPU VARIANT ENV COMMAND EXTRA
  echo "$2 start $(date +%s)" >> $R/probe.log
  timeout 200 env CUDA_VISIBLE_DEVICES=$1 $3 bash -c "$4 $ARGS $5 --out $R/$2 --overwrite" >> $R/$2.log 2>&1
  echo "$2 end $(date +%s)" >> $R/probe.log
}
run 0 base "X=1" "$T" "--cudnn-benchmark off" & run 1 eager "CUDA_MODULE_LOADING=EAGER" "$T" "--cudnn-benchmark off" & wait
run 0 nocudnn "X=1" "$NOCUDNN" "--cudnn-benchmark off" & run 1 autotune "X=1" "$T" "--cudnn-benchmark on" & wait
python3 - <<'PY' | tee $R/summary.txt
import json, pathlib
for v in ["base", "eager", "nocudnn", "autotune"]:
    f = pathlib.Path("runs/probe") / v / "train_log.json"
    if not f.is_file():
        print(v, "no train_log.json"); continue
    h = json.loads(f.read_text())["history"]
    t = [round(b["seconds"] - a, 1) for a, b in zip([0] + [e["seconds"] for e in h], h)]
    print(f"{v:9s} epoch seconds {t}")
PY
[ -n "${OUT:-}" ] && tar czf $OUT/probe.tgz --exclude="*.pt" $R
tail -n 3 $R/*.log
