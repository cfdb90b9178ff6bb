"""BatchNorm recalibration settings against search quality (issue 47): for a fixed, FLOPs-
stratified set of subnets of a shipped supernet, the validation accuracy the search would
score (its own splits: :func:`hwnas.search.replay.replay_splits` with ``scoring=True``) under
several (batches x batch size) recalibration settings and seeds, against a large reference
setting. Rows are appended to a JSONL file as they are measured (resumable); ``--report``
prints the table and writes benchmarks/bn_recalibration.json.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bn_recalibration.py --space mbv3 \
        --dataset cifar10 --subnets 12 --budget 540     # repeat until done
    .venv/bin/python benchmarks/bn_recalibration.py --report
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROWS = HERE / "bn_recalibration_rows.jsonl"
OUT = HERE / "bn_recalibration.json"
#: (batches, batch size, seeds); the first is the search's default (SearchConfig.calib_batches)
SETTINGS = [(10, 64, (0, 1, 2)), (20, 64, (0, 1)), (40, 64, (0, 1)), (10, 128, (0, 1)),
            (40, 256, (0,))]
REFERENCE = (40, 256, 0)


def parse_settings(text: str) -> list[tuple[int, int, tuple[int, ...]]]:
    """``"10x64:0,1,2 40x64:0,1"`` -> [(10, 64, (0, 1, 2)), (40, 64, (0, 1))]."""
    out = []
    for item in text.split():
        size, seeds = item.split(":")
        b, bs = size.split("x")
        out.append((int(b), int(bs), tuple(int(x) for x in seeds.split(","))))
    return out


def machine() -> str:
    import torch
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores (shared), torch threads {torch.get_num_threads()}"


def setup(space_name: str, dataset: str, n: int, seed: int = 0):
    """(space, supernet, the search's scoring splits, archs stratified by FLOPs)."""
    from hwnas.search.config import SearchConfig
    from hwnas.search.replay import replay_splits
    from hwnas.supernet.checkpoints import shipped_checkpoint
    from hwnas.supernet.data.sources import load_dataset
    from hwnas.supernet.train import load_checkpoint

    cfg = SearchConfig(space=space_name, dataset=dataset)
    data = load_dataset(cfg.dataset, seed=cfg.data_seed)
    source = shipped_checkpoint(cfg.space, data.classes)
    if source is None:
        sys.exit(f"no shipped checkpoint for {space_name} on {dataset}")
    space, supernet, payload = load_checkpoint(source, device="cpu")
    data = replay_splits(cfg, payload, str(source), data=data, scoring=True)
    rng = np.random.default_rng(seed)
    pool = [space.sample(rng) for _ in range(400)]
    pool.sort(key=space.flops)
    # n strata of equal count by FLOPs, one seeded pick in each, plus the extremes
    archs = [space.smallest()] + [pool[int(rng.integers(len(pool) * i // n, len(pool) * (i + 1) // n))]
                                  for i in range(n - 2)] + [space.largest()]
    return space, supernet, data, archs


def measure(args) -> None:
    import torch
    from hwnas.supernet.evaluate import accuracy, eval_loader, recalibrated_subnet

    space, supernet, data, archs = setup(args.space, args.dataset, args.subnets)
    done = set()
    if ROWS.exists():
        for line in ROWS.read_text().splitlines():
            r = json.loads(line)
            done.add((r["space"], r["dataset"], r["arch"], r["batches"], r["batch_size"], r["seed"]))
    start = time.monotonic()
    print(f"{len(data.val)} validation images; {len(archs)} subnets", flush=True)
    if args.only is not None:
        archs = [archs[i] for i in args.only]
    settings = parse_settings(args.settings) if args.settings else SETTINGS
    jobs = [(b, bs, s, a) for (b, bs, seeds) in settings for s in seeds for a in archs]
    # per subnet (a slow machine finishes some subnets rather than none): reference first
    # (every comparison needs it), then cheap settings
    order = {space.to_string(a): i for i, a in enumerate(archs)}
    jobs.sort(key=lambda j: (order[space.to_string(j[3])], j[:3] != REFERENCE, j[0] * j[1]))
    for b, bs, s, arch in jobs:
        key = (args.space, args.dataset, space.to_string(arch), b, bs, s)
        if key in done:
            continue
        if time.monotonic() - start > args.budget:
            print("budget spent; run again to continue", flush=True)
            return
        t0 = time.process_time()
        model = recalibrated_subnet(supernet, arch, data, calib_batches=b, calib_batch_size=bs, seed=s)
        t1 = time.process_time()
        acc = accuracy(model, eval_loader(data, data.val))
        t2 = time.process_time()
        row = dict(space=args.space, dataset=args.dataset, arch=key[2], flops=int(space.flops(arch)),
                   batches=b, batch_size=bs, seed=s, val_images=len(data.val), val_top1=acc,
                   calib_cpu_s=t1 - t0, eval_cpu_s=t2 - t1)
        with ROWS.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    print("all measured", flush=True)


def pareto_members(acc: dict, flops: dict) -> set:
    """Archs on the (max accuracy, min FLOPs) front."""
    return {a for a in acc if not any(acc[o] >= acc[a] and flops[o] <= flops[a] and
                                      (acc[o] > acc[a] or flops[o] < flops[a]) for o in acc)}


def report(command: str) -> None:
    from scipy.stats import kendalltau, spearmanr

    rows = [json.loads(l) for l in ROWS.read_text().splitlines()]
    results = []
    for sp, ds in sorted({(r["space"], r["dataset"]) for r in rows}):
        rs = [r for r in rows if (r["space"], r["dataset"]) == (sp, ds)]
        ref = {r["arch"]: r["val_top1"] for r in rs if (r["batches"], r["batch_size"], r["seed"]) == REFERENCE}
        flops = {r["arch"]: r["flops"] for r in rs}
        ref_front = pareto_members(ref, flops)
        for b, bs in sorted({(r["batches"], r["batch_size"]) for r in rs}, key=lambda t: t[0] * t[1]):
            cell = [r for r in rs if (r["batches"], r["batch_size"]) == (b, bs) and r["arch"] in ref]
            seeds = sorted({r["seed"] for r in cell})
            by_seed = {s: {r["arch"]: r["val_top1"] for r in cell if r["seed"] == s} for s in seeds}
            common = sorted(set(ref).intersection(*[set(v) for v in by_seed.values()]))
            if len(common) < 3:
                continue
            taus, rhos, bias, jacc = [], [], [], []
            for s, accs in by_seed.items():
                if (b, bs, s) == REFERENCE:
                    continue
                x = [accs[a] for a in common]
                y = [ref[a] for a in common]
                taus.append(kendalltau(x, y)[0])
                rhos.append(spearmanr(x, y)[0])
                bias.append(float(np.mean(np.subtract(x, y))))
                front = pareto_members({a: accs[a] for a in common}, flops)
                rf = ref_front & set(common)
                jacc.append(len(front & rf) / len(front | rf))
            if not taus:
                continue
            per_arch_std = [float(np.std([by_seed[s][a] for s in seeds], ddof=1))
                            for a in common] if len(seeds) > 1 else [float("nan")]
            calib = [r["calib_cpu_s"] for r in cell]
            evals = [r["eval_cpu_s"] for r in cell]
            results.append(dict(space=sp, dataset=ds, batches=b, batch_size=bs, seeds=len(seeds),
                                subnets=len(common), val_images=cell[0]["val_images"],
                                bias_vs_reference=float(np.mean(bias)),
                                seed_std=float(np.mean(per_arch_std)),
                                kendall_tau_mean=float(np.mean(taus)), kendall_tau_min=float(np.min(taus)),
                                spearman_mean=float(np.mean(rhos)),
                                front_jaccard_mean=float(np.mean(jacc)),
                                calib_cpu_s_median=float(np.median(calib)),
                                eval_cpu_s_median=float(np.median(evals))))
    per_subnet = []
    for (sp, ds, arch, b, bs) in sorted({(r["space"], r["dataset"], r["arch"], r["batches"], r["batch_size"])
                                        for r in rows}, key=lambda k: (k[:3], k[3] * k[4])):
        cell = [r for r in rows if (r["space"], r["dataset"], r["arch"], r["batches"], r["batch_size"])
                == (sp, ds, arch, b, bs)]
        accs = [r["val_top1"] for r in cell]
        ref = [r["val_top1"] for r in rows if (r["space"], r["dataset"], r["arch"]) == (sp, ds, arch)
               and (r["batches"], r["batch_size"], r["seed"]) == REFERENCE]
        per_subnet.append(dict(space=sp, dataset=ds, arch=arch, flops=cell[0]["flops"], batches=b,
                               batch_size=bs, seeds=len(accs), val_images=cell[0]["val_images"],
                               val_top1_mean=float(np.mean(accs)),
                               seed_std=float(np.std(accs, ddof=1)) if len(accs) > 1 else None,
                               bias_vs_reference=float(np.mean(accs) - ref[0]) if ref else None,
                               calib_cpu_s_median=float(np.median([r["calib_cpu_s"] for r in cell])),
                               eval_cpu_s_median=float(np.median([r["eval_cpu_s"] for r in cell]))))
    print(f"{'MFLOPs':>7} {'setting':8} {'seeds':>5} {'top1':>6} {'seedstd':>7} {'bias':>6} {'calib s':>7} {'eval s':>6}")
    for r in per_subnet:
        std = "" if r["seed_std"] is None else f"{r['seed_std']:.2f}"
        bias = "" if r["bias_vs_reference"] is None else f"{r['bias_vs_reference']:.2f}"
        print(f"{r['flops'] / 1e6:7.1f} {r['batches']}x{r['batch_size']:<5} {r['seeds']:>5} "
              f"{r['val_top1_mean']:6.2f} {std:>7} {bias:>6} {r['calib_cpu_s_median']:7.2f} "
              f"{r['eval_cpu_s_median']:6.2f}")
    head = f"{'space':6} {'data':8} {'setting':8} {'n':>3} {'bias':>6} {'seedstd':>7} {'tau':>5} {'taumin':>6} {'rho':>5} {'front':>5} {'calib s':>7} {'eval s':>6}"
    print(head)
    for r in results:
        print(f"{r['space']:6} {r['dataset']:8} {r['batches']}x{r['batch_size']:<5} {r['subnets']:>3} "
              f"{r['bias_vs_reference']:6.2f} {r['seed_std']:7.2f} {r['kendall_tau_mean']:5.2f} "
              f"{r['kendall_tau_min']:6.2f} {r['spearman_mean']:5.2f} {r['front_jaccard_mean']:5.2f} "
              f"{r['calib_cpu_s_median']:7.2f} {r['eval_cpu_s_median']:6.2f}")
    OUT.write_text(json.dumps(dict(command=command, machine=machine(),
                                   date=time.strftime("%Y-%m-%d"), reference=list(REFERENCE),
                                   results=results, per_subnet=per_subnet), indent=1) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--space", default="mbv3")
    p.add_argument("--dataset", default="cifar10")
    p.add_argument("--subnets", type=int, default=12)
    p.add_argument("--budget", type=float, default=540, help="seconds of this invocation")
    p.add_argument("--settings", help='e.g. "40x256:0 10x64:0,1,2 40x64:0,1" (default: SETTINGS)')
    p.add_argument("--only", type=int, nargs="+", help="indices into the stratified subnets "
                   "(0: smallest, subnets-1: largest)")
    p.add_argument("--report", action="store_true")
    args = p.parse_args()
    if args.report:
        report(" ".join(["python"] + sys.argv))
    else:
        measure(args)


if __name__ == "__main__":
    main()
