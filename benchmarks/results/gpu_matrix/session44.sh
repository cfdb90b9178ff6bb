#!/usr/bin/env bash
# The next session's device commands (prepared in session 43), one phase each, straight after
# one another (the machine must stay warm: /tmp/keep and the jobs live on it).
#   0 (S 60):  carry .whl data/c10, lean tree (lean_tree.sh): wheels, the full CIFAR-10 in
#      /tmp/keep; returns at once.
#   1 (S 300), carry data/cct_resume (session 43's returned parts: cctsn200m.ckpt.part00-02 and
#      cct_logs.tgz, 46 MB; git-ignored, so only on the machine that ran session 43): the last
#      1,551 of `cctsn200m`'s 70,200 steps (epoch 195.6 to 200; about 45 s of training, 75 s of
#      compiling) and its evaluation on all 10,000 test images. Session 43 ran out of device
#      time 83 s short and shipped the weights at step 68,649 (89.45 / 83.93 % largest /
#      smallest on the CPU; the learning rate there is 6.3e-7, 0.13 % of its peak).
#      Rule, written before the run: the finished file is the run's end; ship it (fp16, as
#      cct_cifar10.pt; then re-score cifar10_fronts.json and vit_int8_cct.json) if its largest
#      and smallest are each >= session 42's 89.11 / 83.28 and its mean gap to the networks
#      trained alone (89.83 / 84.26) is <= 1 point; otherwise keep session 43's file.
#      If the parts are gone (a new machine), there is nothing to finish: the file stays.
#   bash benchmarks/results/gpu_matrix/session44.sh PHASE SECONDS
set -u
PHASE=$1; S=${2:-300}
. benchmarks/results/gpu_matrix/device_env.sh || exit 1
if [ "$PHASE" = 0 ]; then  # the install above only; which GPU came
  nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv,noheader; exit 0
fi
ls data/cct_resume/cctsn200m.ckpt.part* >/dev/null 2>&1 || [ -f /tmp/cct/cctsn200m/checkpoint.pt ] \
  || { echo "no data/cct_resume carried and no run on this machine: nothing to finish"; exit 1; }
CCT_SPEED="--compile reduce-overhead" CCT_JOBS="cctsn200m" RETURN_CKPT="cctsn200m" \
  bash benchmarks/results/supernet_cifar10/h200_cct.sh $(( ($(left) - 45) / 60 )) > /tmp/res/cct_phase1.log 2>&1
tail -c 900 /tmp/cct/cctsn200m.log | tr '\r' '\n' | grep -a "top-1\|trained steps" | cut -c1-200
python3 - <<'PY'
import json
try:
    top = {s["role"]: s["top1"] for s in json.load(open("/tmp/cct/cctsn200m/eval.json"))["subnets"]}
except (OSError, KeyError, ValueError) as e:
    print(f"rule: not finished yet ({e})"); raise SystemExit(0)
gap = ((89.83 - top["largest"]) + (84.26 - top["smallest"])) / 2
ok = top["largest"] >= 89.11 and top["smallest"] >= 83.28 and gap <= 1
print(f"rule: largest {top['largest']} (>= 89.11), smallest {top['smallest']} (>= 83.28), "
      f"mean gap {gap:.2f} (<= 1): {'SHIP' if ok else 'KEEP the shipped file'}")
PY
tar -czf "$OUT/results.tgz" -C /tmp/res .
