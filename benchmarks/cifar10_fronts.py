"""CIFAR-10 accuracy fronts of the shipped mbv3 and vit supernets, side by side (issue 44.5).

The same number of subnets of each shipped CIFAR-10 supernet (its largest, its smallest and
seeded random ones) are scored the way the search scores a candidate: extracted, BatchNorm
recalibrated on augmented training batches (``hwnas.search.replay`` and the
:class:`~hwnas.search.evaluator.TrialEvaluator`'s settings), float, top-1 on a class-stratified
subset of the CIFAR-10 test images (the same images for both spaces). FLOPs, parameters and
size come from the layer list, latency from the toolkit's estimated devices that run float
models (:func:`~hwnas.search.evaluator.device_latencies`); the fronts (most accurate within
each latency, or size) are :func:`~hwnas.search.pareto.front_indices_2d`'s. Prints a table and
writes ``cifar10_fronts.json`` beside this file, which notebook 04 plots without evaluating
anything. Rows are labelled by the ``--space`` that finds the file (``vit`` also when that is
``cct_cifar10.pt``, the vit family's CCT supernet); the json's ``spaces`` and ``checkpoints``
say which network and file each label scored, ``checkpoint_sha256`` which bytes (a file shipped
under the same name later does not pass for the one scored: ``vit_int8.py`` and the tests check
it)::

    OMP_NUM_THREADS=1 python benchmarks/cifar10_fronts.py [--subnets 8] [--images 1000]
    python benchmarks/cifar10_fronts.py --render [JSON]   # the tables of cifar10_fronts.md
"""

from __future__ import annotations

import argparse
import platform
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hwnas.latency.machine import describe_machine
from hwnas.search.config import SearchConfig
from hwnas.search.evaluator import COST_METRICS, TrialEvaluator, device_latencies
from hwnas.search.pareto import front_indices_2d
from hwnas.search.replay import eval_settings, replay_splits
from hwnas.supernet.checkpoints import shipped_checkpoint
from hwnas.supernet.data import DatasetSplits, load_dataset
from hwnas.supernet.train import load_checkpoint

from hwnas.core.errors import UserError
from hwnas.core.io import file_sha256, write_json

SPACES = ("mbv3", "vit")
#: estimated devices that run a float model as it is (the Edge TPU and the FPGA models want a
#: quantized one: a float subnet there is priced as running on the host, so they are left out)
DEVICES = ("jetson-orin-nano-est", "pixel7-cpu-est", "raspi4-est")
#: what a front trades accuracy against: each device's latency, and the parameter count
COSTS = tuple(f"latency_ms:{d}" for d in DEVICES) + ("params",)
OUT_JSON = Path(__file__).with_suffix(".json")
REPO = Path(__file__).resolve().parent.parent


def pick_subnets(space: Any, n: int, seed: int) -> list[tuple[str, Any]]:
    """``n`` distinct (role, architecture) pairs of ``space``: its largest, its smallest, then
    random ones drawn with ``seed`` (``space.sample``)."""
    if n < 2:
        raise UserError(f"--subnets {n}: need at least 2 (the largest and the smallest)")
    picks = [("largest", space.largest()), ("smallest", space.smallest())]
    seen = {space.to_string(a) for _, a in picks}
    rng = np.random.default_rng(seed)
    for _ in range(1000 * n):
        if len(picks) >= n:
            break
        arch = space.sample(rng)
        if space.to_string(arch) not in seen:
            seen.add(space.to_string(arch))
            picks.append(("random", arch))
    if len(picks) < n:
        raise UserError(f"--subnets {n}: space {space.name!r} gave only {len(picks)} distinct "
                        f"architectures")
    return picks


def measure(space: Any, supernet: Any, data: DatasetSplits, picks: Sequence[tuple[str, Any]],
            devices: Sequence[str], settings: Any, *, label: str | None = None,
            log: Callable[[str], Any] = print) -> list[dict[str, Any]]:
    """One row per pick: space (``label``, default the space's name), role, arch, test top-1 %
    (BN-recalibrated float subnet, as the search scores it), FLOPs, params, float size and each
    device's latency in ms."""
    label = label or space.name
    evaluator = TrialEvaluator(space, supernet, data, list(devices), settings)
    archs = [a for _, a in picks]
    latency = {name: device_latencies(evaluator.devices[name], space, archs,
                                      [None] * len(archs))[0] for name in devices}
    rows = []
    for i, (role, arch) in enumerate(picks):
        t0 = time.perf_counter()
        top1, _ = evaluator.scored_model(arch, None, split="test")
        layers = space.layers(arch)
        cost = {k: COST_METRICS[k](layers, layers, None) for k in ("flops", "params", "size_bytes")}
        row = {"space": label, "role": role, "arch": space.to_string(arch),
               "top1": round(float(top1), 2), "flops": int(cost["flops"]),
               "params": int(cost["params"]), "size_bytes": int(cost["size_bytes"]),
               **{f"latency_ms:{d}": round(float(latency[d][i]), 4) for d in devices},
               "eval_seconds": round(time.perf_counter() - t0, 1)}
        rows.append(row)
        log(f"{label} {i + 1}/{len(picks)} {role:8s} {row['top1']:6.2f} % "
            f"{row['flops'] / 1e6:7.1f} MFLOPs [{row['eval_seconds']:.0f} s] {row['arch']}")
    return rows


def fronts(rows: Sequence[dict[str, Any]], costs: Sequence[str]) -> dict[str, dict[str, list[str]]]:
    """``{cost: {space: the archs on its accuracy front, cheapest first}}``: the subnets no
    cheaper one of the same space matches in top-1 (``front_indices_2d``)."""
    out: dict[str, dict[str, list[str]]] = {}
    spaces = list(dict.fromkeys(r["space"] for r in rows))
    for cost in costs:
        out[cost] = {}
        for name in spaces:
            mine = [r for r in rows if r["space"] == name]
            idx = front_indices_2d(np.array([r[cost] for r in mine], float),
                                   np.array([r["top1"] for r in mine], float))
            out[cost][name] = [mine[i]["arch"] for i in idx]
    return out


def load_space(name: str, data: DatasetSplits, cfg: SearchConfig
               ) -> tuple[Any, Any, DatasetSplits, str]:
    """(space, supernet, its scoring splits, checkpoint path) of the supernet shipped for
    ``name`` on ``data``; the splits are the search's (``replay_splits``, scoring budget)."""
    checkpoint = shipped_checkpoint(name, data.classes)
    if checkpoint is None:
        raise UserError(f"no shipped checkpoint for space {name!r} on {data.name!r}")
    space, supernet, payload = load_checkpoint(checkpoint)
    supernet.eval()
    return (space, supernet, replay_splits(cfg, payload, str(checkpoint), data=data, scoring=True),
            str(checkpoint))


def table(rows: Sequence[dict[str, Any]], devices: Sequence[str], front: dict) -> str:
    """The rows as a Markdown table, each space by parameter count; * marks the accuracy front
    over the first device's latency, + the one over parameters."""
    lat = [f"latency_ms:{d}" for d in devices]
    lines = ["| space | role | top-1 % | MFLOPs | params M | " + " | ".join(
        f"{d} ms" for d in devices) + " | front | arch |",
        "|---|---|---:|---:|---:|" + "---:|" * len(devices) + "---|---|"]
    for r in sorted(rows, key=lambda r: (r["space"], r["params"])):
        mark = ("*" if r["arch"] in front[lat[0]][r["space"]] else "") + (
            "+" if r["arch"] in front["params"][r["space"]] else "")
        lines.append(f"| {r['space']} | {r['role']} | {r['top1']:.2f} | {r['flops'] / 1e6:.1f} | "
                     f"{r['params'] / 1e6:.2f} | " + " | ".join(f"{r[k]:.3f}" for k in lat)
                     + f" | {mark} | `{r['arch']}` |")
    return "\n".join(lines)


def budgets(rows: Sequence[dict[str, Any]], costs: Sequence[str]) -> str:
    """Per cost, a Markdown table of the two spaces' median-subnet ratio (``SPACES[1]`` over
    ``SPACES[0]``) and the best top-1 of each within the median cost of all the rows (the role
    added where it is the largest or smallest): who leads at a middle budget."""
    a, b = SPACES
    lines = [f"| cost | median {b} / median {a} | budget | {a} | {b} |",
             "|---|---:|---:|---:|---:|"]
    for cost in costs:
        mine = {s: [r for r in rows if r["space"] == s] for s in SPACES}
        budget = float(np.median([r[cost] for r in rows]))
        best = {}
        for s in SPACES:
            ok = [r for r in mine[s] if r[cost] <= budget]
            top = max(ok, key=lambda r: r["top1"]) if ok else None
            best[s] = ("none" if top is None else f"{top['top1']:.1f}" + (
                f" ({top['role']})" if top["role"] != "random" else ""))
        ratio = np.median([r[cost] for r in mine[b]]) / np.median([r[cost] for r in mine[a]])
        scale = 1e6 if cost == "params" else 1.0
        lines.append(f"| {cost} | {ratio:.2f} | {budget / scale:.3g} | {best[a]} | {best[b]} |")
    return "\n".join(lines)


def render(path: Path) -> str:
    """The tables of a written json (rows, then the budgets), without evaluating anything."""
    import json
    doc = json.loads(path.read_text())
    return (f"{doc['command']}\n{doc['machine']}; {doc['date']}; {doc['seconds']:.0f} s "
            f"{doc['eval_seconds']}; {doc['images']} test images; checkpoints "
            f"{doc['checkpoints']}, spaces {doc.get('spaces')}\n\n"
            + table(doc["results"], doc["devices"], doc["fronts"]) + "\n\n"
            + budgets(doc["results"], COSTS))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--subnets", type=int, default=8,
                   help="subnets per space, the largest and smallest included (default 8)")
    p.add_argument("--images", type=int, default=1000,
                   help="class-stratified CIFAR-10 test images (0: all 10,000; default 1000)")
    p.add_argument("--calib-batches", type=int, default=SearchConfig.calib_batches,
                   help="BatchNorm recalibration batches of 64 (default the search's, "
                        f"{SearchConfig.calib_batches})")
    p.add_argument("--seed", type=int, default=0, help="random subnets' and splits' seed")
    p.add_argument("--out", type=Path, default=OUT_JSON)
    p.add_argument("--render", type=Path, nargs="?", const=OUT_JSON, metavar="JSON",
                   help="print the tables of a written json (default the committed one) and exit")
    args = p.parse_args(argv)
    if args.render is not None:
        print(render(args.render))
        return 0
    words = ([sys.argv[0], *sys.argv[1:]] if argv is None
             else ["benchmarks/cifar10_fronts.py", *argv])
    command = "OMP_NUM_THREADS=1 python " + " ".join(shlex.quote(a) for a in words)
    start = time.perf_counter()
    try:
        if args.images < 0:
            raise UserError(f"--images {args.images}: expected 0 (every test image) or more")
        if args.calib_batches < 1:
            raise UserError(f"--calib-batches {args.calib_batches}: expected 1 or more")
        if args.subnets < 2:
            raise UserError(f"--subnets {args.subnets}: need at least 2 (the largest and the "
                            f"smallest)")
        torch.set_num_threads(1)
        data = load_dataset("cifar10", seed=args.seed)
        rows: list[dict[str, Any]] = []
        doc: dict[str, Any] = {"checkpoints": {}, "checkpoint_sha256": {}, "spaces": {},
                               "eval_seconds": {}}
        test = None
        for name in SPACES:
            cfg = SearchConfig(space=name, dataset="cifar10", data_seed=args.seed, seed=args.seed,
                               eval_images=args.images, calib_batches=args.calib_batches,
                               devices=list(DEVICES))
            cfg.validate()
            space, supernet, splits, checkpoint = load_space(name, data, cfg)
            if test is None:
                test = splits.test
            elif not (torch.equal(test.images, splits.test.images)
                      and torch.equal(test.labels, splits.test.labels)):
                raise UserError(f"the test images of {name!r} differ from {SPACES[0]!r}'s; the "
                                f"fronts would not compare")
            settings = eval_settings(cfg)
            t0 = time.perf_counter()
            rows += measure(space, supernet, splits, pick_subnets(space, args.subnets, args.seed),
                            DEVICES, settings, label=name)  # by the --space that finds it
            doc["checkpoints"][name] = (str(Path(checkpoint).relative_to(REPO))
                                        if Path(checkpoint).is_relative_to(REPO) else checkpoint)
            doc["checkpoint_sha256"][name] = file_sha256(checkpoint)
            doc["spaces"][name] = space.name  # vit's shipped supernet may be cct's
            doc["eval_seconds"][name] = round(time.perf_counter() - t0, 1)
        assert test is not None
        per_class = np.bincount(test.labels.numpy(), minlength=len(data.classes)).tolist()
        front = fronts(rows, COSTS)
        doc = {"command": command,
               "machine": describe_machine(f"CPU only, 1 torch thread, torch {torch.__version__}, "
                                           f"Python {platform.python_version()}"),
               "date": datetime.now(UTC).isoformat(timespec="seconds"),
               "dataset": "cifar10", "split": "test", "images": len(test),
               "images_per_class": per_class, "subnets_per_space": args.subnets,
               "seed": args.seed, "calib_batches": settings.calib_batches,
               "calib_batch_size": 64, "precision": "float32", "devices": list(DEVICES),
               **doc, "seconds": round(time.perf_counter() - start, 1),
               "results": rows, "fronts": front}
        write_json(args.out, doc)
    except UserError as exc:
        print(f"cifar10_fronts: error: {exc}", file=sys.stderr)
        return 2
    print(f"\n{len(test)} CIFAR-10 test images ({per_class[0]} per class where even), float, "
          f"BatchNorm recalibrated on {settings.calib_batches} x 64 augmented training images; "
          f"* = on the accuracy-latency front ({DEVICES[0]}), + = on the accuracy-params front\n")
    print(table(rows, DEVICES, front))
    print(f"\n{doc['seconds']:.0f} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
