#!/usr/bin/env bash
# The next session's device commands (prepared in session 42), one phase each, straight after
# one another (the machine must stay warm: /tmp/keep and the jobs live on it).
#   0 (S 60):  carry .whl data/c10, lean tree (lean_tree.sh): wheels, the full CIFAR-10 in
#      /tmp/keep; returns at once.
#   1 (S 560; any PHASE other than 0), repeated until it prints the evaluation: issue 44 item 2's smallest subnet. The
#      shipped CCT supernet (session 42's `cctsn150m`, 150 epochs in 1,124 s with the masked
#      random subnets) has largest / smallest 89.11 / 83.28 %; the same networks trained alone
#      reach 89.83 / 84.26 (200 epochs;
#      CCT-2's the mean of three seeds). Session 42's time saving allows CCT's own 200
#      epochs (`cctsn200m`; about 1,550 s on an H100: 80 x 3.8 + 120 x 9.8 + 75 s compiling).
#      The whole budget is about 1,750 s with phase 0, so nothing else fits this session.
#      A lost machine costs one command: carry data/cct_resume (the returned parts) on a new one,
#      separately from data/c10 (CCT_JOBS=none in the first command, as h200_cct.sh says).
#      Rule, written before the run (printed when it has finished): ship it (fp16, as
#      cct_cifar10.pt; then re-score cifar10_fronts.json and vit_int8_cct.json, as session 42
#      did) if its largest and smallest are each >= the shipped file's 89.11 / 83.28 and its mean
#      gap to the networks trained alone (89.83 / 84.26) is <= 1 point; otherwise keep the file.
#   Session 43 ran it (0 60, 1 560, 1 560, 1 595, 1 205) and ran out of device time 83 s
#      short: step 68,649 of 70,200 (epoch 195.6), returned as data/cct_resume/ (the three
#      cctsn200m.ckpt.partNN and cct_logs.tgz, 46 MB, git-ignored: only on the machine that ran
#      it). The stopped weights passed the rule and are shipped (supernet_cifar10.md, "Session
#      43"). To finish (the next session): `0 60` as above, then `FINISH_ONLY=1 ... 1 300` with
#      carry data/cct_resume: about 45 s of training, 75 s of compiling, the evaluation; the same
#      rule decides whether the finished file replaces the shipped one (cct43/save_half.py on the
#      returned cctsn200m.supernet.pt). FINISH_ONLY=1 refuses to
#      start the run afresh when the parts are gone.
#   Session 44 finished it (0 60, FINISH_ONLY=1 1 300): 89.46 / 83.86 on the GPU, SHIP (shipped).
#   Session 44 then started RUN=cctsnkd200 (the same recipe with the shipped mbv3 supernet's
#      largest subnet as teacher, --teacher-weight 1.0, as vit run 4 did: +1.4-2.0 points for
#      every vit subnet). About 1,900 s on an H100, so it spans two sessions: the parts return
#      as data/cct_resume/cctsnkd200.ckpt.partNN (46 MB, git-ignored, only on the VM that ran
#      it). Lean the tree keeping the teacher: lean_tree.sh supernet/checkpoints/mbv3.
#      Rule, written before the run: ship it if its largest and smallest are each >= the
#      shipped cctsn200m's 89.46 / 83.86 (GPU evaluation; FLOORS="89.46 83.86") and its mean
#      gap to the networks trained alone (89.83 / 84.26, no teacher) is <= 1 point.
#   [RUN=name] [FLOORS="largest smallest"] [FINISH_ONLY=1] bash benchmarks/results/gpu_matrix/session43.sh PHASE SECONDS
set -u
PHASE=$1; S=${2:-560}
. benchmarks/results/gpu_matrix/device_env.sh || exit 1
if [ "$PHASE" = 0 ]; then  # the install above only; which GPU came
  nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv,noheader; exit 0
fi
RUN=${RUN:-cctsn200m}; export RUN FLOORS=${FLOORS:-89.11 83.28}
if [ "${FINISH_ONLY:-0}" = 1 ] && ! ls data/cct_resume/$RUN.ckpt.part* >/dev/null 2>&1 \
    && [ ! -f /tmp/cct/$RUN/checkpoint.pt ]; then
  echo "FINISH_ONLY: no data/cct_resume carried and no run on this machine: nothing to finish"; exit 1
fi
CCT_SPEED="--compile reduce-overhead" CCT_JOBS="$RUN" RETURN_CKPT="$RUN" \
  bash benchmarks/results/supernet_cifar10/h200_cct.sh $(( ($(left) - 60) / 60 )) > /tmp/res/cct_phase1.log 2>&1
tail -c 900 /tmp/cct/$RUN.log | tr '\r' '\n' | grep -a "top-1\|trained steps" | cut -c1-200
tail -c 600 /tmp/cct/$RUN.log | tr "\r" "\n" | grep -a "step/s" | tail -1 | cut -c1-160
python3 - <<'PY'
import json, os
lo_largest, lo_smallest = map(float, os.environ["FLOORS"].split())
try:
    top = {s["role"]: s["top1"] for s in json.load(open(f"/tmp/cct/{os.environ['RUN']}/eval.json"))["subnets"]}
except (OSError, KeyError, ValueError) as e:
    print(f"rule: not finished yet ({e})"); raise SystemExit(0)
gap = ((89.83 - top["largest"]) + (84.26 - top["smallest"])) / 2
ok = top["largest"] >= lo_largest and top["smallest"] >= lo_smallest and gap <= 1
print(f"rule: largest {top['largest']} (>= {lo_largest}), smallest {top['smallest']} (>= {lo_smallest}), "
      f"mean gap {gap:.2f} (<= 1): {'SHIP' if ok else 'KEEP the shipped file'}")
PY
tar -czf "$OUT/results.tgz" -C /tmp/res .
