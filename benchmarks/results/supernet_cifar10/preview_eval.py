"""Test top-1 of a supernet checkpoint's ``--eval`` subnets on this CPU (session 39's preview of
the unfinished CCT supernet, ``supernet_cifar10.md`` "Session 39").

Loads a run's ``checkpoint.pt`` (or a ``supernet.pt``), evaluates the subnets of
:func:`hwnas.supernet.train_run.eval_archs` on every test image the way ``hwnas train --eval``
does (:func:`~hwnas.supernet.evaluate.evaluate_subnet`), optionally with every weight rounded to
fp16 and back (``--half``: what a file stored in half precision would score)::

    OMP_NUM_THREADS=1 python benchmarks/results/supernet_cifar10/preview_eval.py CKPT \
        --data /tmp/keep/cifar10-jpeg.npz [--roles largest smallest] [--half] [--out rows.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from hwnas.supernet.checkpoint_io import load_checkpoint
from hwnas.supernet.decoded import load_training_data
from hwnas.supernet.evaluate import evaluate_subnet
from hwnas.supernet.train_run import eval_archs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--data", required=True, help="the npz the run was trained on")
    ap.add_argument("--roles", nargs="+", default=None, help="eval_archs roles (default: all)")
    ap.add_argument("--half", action="store_true", help="weights rounded to fp16 and back")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    space, model, payload = load_checkpoint(args.checkpoint)
    model = model.float()
    if args.half:
        with torch.no_grad():
            for t in model.state_dict().values():
                if t.is_floating_point():
                    t.copy_(t.half().float())
    step = payload.get("train_state", {}).get("step")
    data = load_training_data(args.data)
    rows = []
    for role, arch in eval_archs(space):
        if args.roles and role not in args.roles:
            continue
        t0 = time.perf_counter()
        acc, _ = evaluate_subnet(model, arch, data, split="test", batch_size=500)
        rows.append({"role": role, "arch": space.to_string(arch), "top1": acc,
                     "params": space.params(arch), "step": step, "half": args.half})
        print(f"{role:9s} {acc:6.2f} %  {space.params(arch) / 1e6:5.2f} M params  "
              f"{space.to_string(arch)}  ({time.perf_counter() - t0:.0f} s)", flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
