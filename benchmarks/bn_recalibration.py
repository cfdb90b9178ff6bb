"""BatchNorm recalibration settings against search quality (issue 47): for a fixed, FLOPs-
stratified set of subnets of a shipped supernet, the validation accuracy the search would
score (its own splits: :func:`hwnas.search.replay.replay_splits` with ``scoring=True``) under
several (batches x batch size) recalibration settings and seeds, against a large reference
setting. Rows are appended to a JSONL file as they are measured (resumable); ``--report``
prints the table, how each setting ranks the subnets against the reference (Kendall tau,
Spearman, the pairs whose order flips and their reference gaps) and the keep/change rule of
benchmarks/bn_recalibration.md, and writes benchmarks/bn_recalibration.json.

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

try:  # run as a script, benchmarks/ is on sys.path; loaded by a test, the repo root is
    from cifar_tools import kendall_tau
except ModuleNotFoundError:
    from benchmarks.cifar_tools import kendall_tau

HERE = Path(__file__).resolve().parent
ROWS = HERE / "bn_recalibration_rows.jsonl"
OUT = HERE / "bn_recalibration.json"
#: (batches, batch size, seeds); the first is the search's default (SearchConfig.calib_batches)
SETTINGS = [(10, 64, (0, 1, 2)), (20, 64, (0, 1)), (40, 64, (0, 1)), (10, 128, (0, 1)),
            (40, 256, (0,))]
REFERENCE = (40, 256, 0)
#: (batches, batch size) whose two seeds stand in for the reference's noise when its seed 1 is missing
PROXY = (40, 64)


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


def ranking_agreement(x, ref, spread: float | None = None) -> dict:
    """How readings ``x`` order subnets against reference readings ``ref`` (same subnets, same
    order): Kendall tau-b, Spearman rho, and the flips, the pairs that ``ref`` orders strictly
    one way and ``x`` strictly the other, each with its reference gap. ``spread``, the
    reference's own seed spread, counts the flips too wide for the reference's noise to make."""
    from scipy.stats import spearmanr

    x, ref = np.asarray(x, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    flips = [(i, j, float(abs(ref[i] - ref[j]))) for i in range(len(x)) for j in range(i + 1, len(x))
             if np.sign(x[i] - x[j]) * np.sign(ref[i] - ref[j]) < 0]
    gaps = [g for _, _, g in flips]
    return dict(kendall_tau=kendall_tau(x, ref), spearman=float(spearmanr(x, ref)[0]),
                pairs=len(x) * (len(x) - 1) // 2, flips=flips, max_flip_gap=max(gaps, default=0.0),
                flips_beyond_spread=None if spread is None else sum(g > spread + 1e-9 for g in gaps))


def decide(ref: dict, noise: tuple[dict, dict], default: list[dict], proxy: bool = False,
           min_tau_subnets: int = 6) -> dict:
    """The session-32 rule (benchmarks/bn_recalibration.md): keep the default setting if the mean
    of its seeds' tau against the reference ``ref`` is at least the reference's own seed-to-seed
    tau, or if none of its seeds flips a pair wider than the reference's spread. ``noise`` is
    the reference's two seeds: their tau, on the subnets they share (at least
    ``min_tau_subnets``, else that half of the rule is not judged), and their spread, the
    largest difference on one subnet; the flips are counted on every subnet that ``ref`` and
    all of ``default`` (readings {arch: top-1}) have. ``proxy``: another setting's two seeds
    stand in for the reference's, so the verdict is provisional."""
    archs = sorted(set(ref).intersection(*default))
    noisy = sorted(set(archs).intersection(*noise))
    d_ref = max(abs(noise[0][a] - noise[1][a]) for a in noisy)
    per_seed = [ranking_agreement([x[a] for a in archs], [ref[a] for a in archs], d_ref) for x in default]
    beyond = sum(p["flips_beyond_spread"] for p in per_seed)
    tau_ref = tau_mean = None
    if len(noisy) >= min_tau_subnets:
        tau_ref = kendall_tau([noise[0][a] for a in noisy], [noise[1][a] for a in noisy])
        tau_mean = float(np.mean([kendall_tau([x[a] for a in noisy], [ref[a] for a in noisy])
                                  for x in default]))
    keep = (tau_mean is not None and tau_mean >= tau_ref) or beyond == 0
    return dict(subnets=len(archs), noise_subnets=len(noisy), tau_ref=tau_ref, d_ref=d_ref,
                proxy=proxy, default_tau_mean_on_noise_subnets=tau_mean,
                default_tau_mean=float(np.mean([p["kendall_tau"] for p in per_seed])),
                default_flips=[len(p["flips"]) for p in per_seed],
                default_flips_beyond_d_ref=beyond, keep_default=keep,
                flipped=[dict(seed=i, a=archs[f[0]], b=archs[f[1]], ref_gap=f[2])
                         for i, p in enumerate(per_seed) for f in p["flips"]],
                verdict=("keep" if keep else "change") + (" (provisional)" if proxy else ""))


def report(command: str) -> None:
    rows = [json.loads(l) for l in ROWS.read_text().splitlines()]
    results, decisions = [], []
    for sp, ds in sorted({(r["space"], r["dataset"]) for r in rows}):
        rs = [r for r in rows if (r["space"], r["dataset"]) == (sp, ds)]

        def reading(b: int, bs: int, s: int) -> dict:
            return {r["arch"]: r["val_top1"] for r in rs
                    if (r["batches"], r["batch_size"], r["seed"]) == (b, bs, s)}
        ref = reading(*REFERENCE)
        flops = {r["arch"]: r["flops"] for r in rs}
        ref_front = pareto_members(ref, flops)
        # the reference's own noise: its seed 1, else 40 x 64's two seeds (a lenient stand-in)
        proxy = len(set(ref).intersection(reading(*REFERENCE[:2], 1))) < 2
        noise = (reading(*PROXY, 1), reading(*PROXY, 0)) if proxy else (reading(*REFERENCE[:2], 1), ref)
        # the rule on the default's seeds, then the same test on every other measured setting
        # of at least two seeds, cheapest first (the rule proposes the cheapest that passes)
        sizes = sorted({(r["batches"], r["batch_size"]) for r in rs} - {REFERENCE[:2]},
                       key=lambda t: (t != SETTINGS[0][:2], t[0] * t[1]))
        d_ref = None
        for b, bs in sizes:
            seeds = SETTINGS[0][2] if (b, bs) == SETTINGS[0][:2] else \
                sorted({r["seed"] for r in rs if (r["batches"], r["batch_size"]) == (b, bs)})
            readings = [reading(b, bs, s) for s in seeds]
            if len(seeds) < 2 or len(set(ref).intersection(*readings)) < 3 or \
                    len(set(ref).intersection(*noise)) < 2:
                continue
            d = decide(ref, noise, readings, proxy)
            d["flipped"] = [dict(f, a_mflops=flops[f["a"]] / 1e6, b_mflops=flops[f["b"]] / 1e6)
                            for f in d["flipped"]]
            decisions.append(dict(space=sp, dataset=ds, setting=f"{b}x{bs}", seeds=list(seeds), **d))
            if (b, bs) == SETTINGS[0][:2]:
                d_ref = d["d_ref"]
        for b, bs in sorted({(r["batches"], r["batch_size"]) for r in rs}, key=lambda t: t[0] * t[1]):
            cell = [r for r in rs if (r["batches"], r["batch_size"]) == (b, bs) and r["arch"] in ref]
            seeds = sorted({r["seed"] for r in cell})
            by_seed = {s: {r["arch"]: r["val_top1"] for r in cell if r["seed"] == s} for s in seeds}
            common = sorted(set(ref).intersection(*[set(v) for v in by_seed.values()]))
            y = [ref[a] for a in common]
            agree, bias, jacc = [], [], []
            for s, accs in by_seed.items():
                if len(common) < 3 or (b, bs, s) == REFERENCE:
                    continue
                x = [accs[a] for a in common]
                agree.append(ranking_agreement(x, y, d_ref))
                bias.append(float(np.mean(np.subtract(x, y))))
                front = pareto_members({a: accs[a] for a in common}, flops)
                rf = ref_front & set(common)
                jacc.append(len(front & rf) / len(front | rf))
            if not agree:
                continue
            per_arch_std = [float(np.std([by_seed[s][a] for s in seeds], ddof=1))
                            for a in common] if len(seeds) > 1 else [float("nan")]
            mean_x = [float(np.mean([by_seed[s][a] for s in seeds])) for a in common]
            self_taus = [kendall_tau([by_seed[s][a] for a in common], [by_seed[t][a] for a in common])
                         for i, s in enumerate(seeds) for t in seeds[i + 1:]]
            taus = [g["kendall_tau"] for g in agree]
            results.append(dict(space=sp, dataset=ds, batches=b, batch_size=bs, seeds=len(seeds),
                                subnets=len(common), val_images=cell[0]["val_images"],
                                bias_vs_reference=float(np.mean(bias)),
                                seed_std=float(np.mean(per_arch_std)),
                                kendall_tau_mean=float(np.mean(taus)), kendall_tau_min=float(np.min(taus)),
                                spearman_mean=float(np.mean([g["spearman"] for g in agree])),
                                kendall_tau_of_seed_mean=kendall_tau(mean_x, y),
                                seed_to_seed_tau_mean=float(np.mean(self_taus)) if self_taus else None,
                                pairs=agree[0]["pairs"], flips_per_seed=[len(g["flips"]) for g in agree],
                                max_flip_gap=max(g["max_flip_gap"] for g in agree),
                                flips_beyond_d_ref=None if d_ref is None else
                                sum(g["flips_beyond_spread"] for g in agree),
                                front_jaccard_mean=float(np.mean(jacc)),
                                calib_cpu_s_median=float(np.median([r["calib_cpu_s"] for r in cell])),
                                eval_cpu_s_median=float(np.median([r["eval_cpu_s"] for r in cell]))))
    per_subnet = []
    arch_flops = {r["arch"]: r["flops"] for r in rows}
    for (sp, ds, arch, b, bs) in sorted({(r["space"], r["dataset"], r["arch"], r["batches"], r["batch_size"])
                                        for r in rows}, key=lambda k: (k[:2], arch_flops[k[2]], k[2], k[3] * k[4])):
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
    print(f"{'space':6} {'data':8} {'setting':8} {'n':>3} {'bias':>6} {'seedstd':>7} {'tau':>5} "
          f"{'taumin':>6} {'tau(mean)':>9} {'self tau':>8} {'rho':>5} {'flips/pairs':>12} {'maxgap':>6} "
          f"{'>d_ref':>6} {'front':>5} {'calib s':>7} {'eval s':>6}")
    for r in results:
        self_tau = "" if r["seed_to_seed_tau_mean"] is None else f"{r['seed_to_seed_tau_mean']:.2f}"
        beyond = "" if r["flips_beyond_d_ref"] is None else str(r["flips_beyond_d_ref"])
        flips = ",".join(map(str, r["flips_per_seed"])) + f"/{r['pairs']}"
        print(f"{r['space']:6} {r['dataset']:8} {r['batches']}x{r['batch_size']:<5} {r['subnets']:>3} "
              f"{r['bias_vs_reference']:6.2f} {r['seed_std']:7.2f} {r['kendall_tau_mean']:5.2f} "
              f"{r['kendall_tau_min']:6.2f} {r['kendall_tau_of_seed_mean']:9.2f} {self_tau:>8} "
              f"{r['spearman_mean']:5.2f} {flips:>12} {r['max_flip_gap']:6.2f} {beyond:>6} "
              f"{r['front_jaccard_mean']:5.2f} {r['calib_cpu_s_median']:7.2f} {r['eval_cpu_s_median']:6.2f}")
    for d in decisions:
        tau = "not judged" if d["tau_ref"] is None else \
            f"{d['tau_ref']:.3f} (this setting {d['default_tau_mean_on_noise_subnets']:.3f})"
        default = d["setting"] == "{}x{}".format(*SETTINGS[0][:2])
        print(f"rule ({d['space']} {d['dataset']} {d['setting']}, {d['subnets']} subnets; reference "
              f"noise on {d['noise_subnets']}): reference seed-to-seed tau {tau}, spread d_ref "
              f"{d['d_ref']:.2f}{' (40x64 stand-in)' if d['proxy'] else ''}; "
              f"tau mean {d['default_tau_mean']:.3f}, flips per seed {d['default_flips']}, "
              f"beyond d_ref {d['default_flips_beyond_d_ref']} -> "
              + (d["verdict"] if default else "passes" if d["keep_default"] else "fails"))
        for f in d["flipped"]:
            print(f"  seed {f['seed']}: {f['a_mflops']:.1f} vs {f['b_mflops']:.1f} MFLOPs, reference gap "
                  f"{f['ref_gap']:.2f}")
    OUT.write_text(json.dumps(dict(command=command, machine=machine(),
                                   date=time.strftime("%Y-%m-%d"), reference=list(REFERENCE),
                                   results=results, decision=decisions, per_subnet=per_subnet),
                              indent=1) + "\n")


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
