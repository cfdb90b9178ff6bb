"""Few-shot latency prediction on unseen devices: HELP's protocol, every predictor, both spaces.

For each space (nb201, fbnet), each unseen test device, each number of measurements ``n`` in
{2, 5, 10, 20} and each seed, every predictor is adapted to ``n`` measurements of the device and
ranks architectures; the score is Spearman's rho between predicted and measured latency

* ``all``: over every architecture of the table (15,625 for nb201, 5,000 for fbnet);
* ``help800``: over HELP's query set - ``arch_idx`` 900-1899 (nb201) / 4000-4999 (fbnet) without
  the 10% fastest and 10% slowest on the device (HELP's ``loader.py``), i.e. 800 architectures.

Protocol (from ``hwnas.latency.tables.HELP_PROTOCOLS``): meta-training uses HELP's 9 meta-training
devices and only the architectures outside the query range; measured samples come from outside
the query range too. "n measurements" is everything measured on the new device: the meta
predictor measures its first ``n`` reference architectures (chosen at meta-training from a pool
drawn with the seed) and nothing else; the other predictors measure ``n`` architectures drawn at
random with the seed (the same ones for every predictor). Three ablations of the meta predictor:
``meta[random]`` adapts on those random samples instead of its reference architectures,
``meta[help-refs]`` (n = 10) on HELP's 10 reference architectures, and ``meta[v1]`` is the
previous version of the meta predictor (no execution variants, Gaussian noise; its own reference
architectures), kept to show what the current one changes. ``adapt_seconds`` is the wall time of
``adapt()`` (mean over seeds). HELP's published numbers are printed beside ours.

``lowrank`` is the low-rank prior predictor (:class:`LowRankPredictor`, meta-trained per seed on
the same devices, each family weighing the same), measured on its own reference architectures;
``lowrank[random]`` on the random samples. ``--lofo [FILE ...]`` adds the family protocol
(leave-one-family-out over HELP's and the measured devices, ``benchmarks/latency_lofo.py``): one
row per space, predictor, measurement kind and held-out family (``protocol`` ``lofo-<family>``,
``device`` = the family, ``family`` and its ``devices``; ``[random]`` appended to the predictor
for 10 random measurements) and ``lofo-mean`` / ``lofo-worst`` rows, read from the given
latency_lofo JSON files or computed when none is given.

``--split validation`` scores the validation devices instead (hyper-parameters were chosen
there); ``--latency-csv PATH --device COLUMN [--space S]`` scores a table of a device we have
never seen (same CSV layout) the same way, with the shipped meta-trained predictor.
``--write-pretrained`` saves, per space, the meta (and, when asked for, lowrank) predictor of
the seed that ranks the VALIDATION devices best with 10 measurements to ``latency/data/`` (what
``hwnas`` ships). Runs in a few minutes on 2 CPU cores.

    python benchmarks/latency_fewshot.py
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from hwnas.latency.machine import describe_machine
from hwnas.latency.predictors import (  # noqa: E402
    DEFAULT_PREDICTOR,
    LatencyPredictor,
    LowRankPredictor,
    MetaPredictor,
    get_predictor,
    load_pretrained,
    pretrained_path,
)
from hwnas.latency.tables import (  # noqa: E402
    FewShotProtocol,
    LatencyTable,
    help_protocol,
    load_latency_table,
    load_shared_table,
)
from hwnas.supernet.spaces import get_space  # noqa: E402

from hwnas.core.errors import UserError  # noqa: E402
from hwnas.core.maths import spearman  # noqa: F401 - the benchmarks import it from here

OUT_JSON = Path(__file__).with_suffix(".json")
BASELINES = ("flops", "lut", "mlp")
ALL_PREDICTORS = (*BASELINES, "meta", "meta[random]", "meta[help-refs]", "meta[v1]", "lowrank",
                  "lowrank[random]")
#: the family protocol's predictors (``benchmarks/latency_lofo.py``) -> names in this file's rows
LOFO_NAMES = {"meta": "meta", "flops": "flops", "opcount": "opcount", "lowrank": "lowrank",
              "meta+lowrank": "meta+lowrank", "meta+opcount": "meta+opcount",
              "meta|opcount": "meta|opcount"}
#: Options that turn the current meta predictor into the previous version (``meta[v1]``).
V1_OPTIONS: dict[str, Any] = {"execution": ("raw",), "robust_iterations": 0, "pair_profiles": 0.0}


def machine() -> str:
    return describe_machine("no GPU used")


class Task:
    """One device of one table to score: ranks, query set, sample pool."""

    def __init__(self, table: LatencyTable, device: str, protocol: FewShotProtocol | None,
                 pool_rows: np.ndarray) -> None:
        self.table, self.device = table, device
        self.y = table.column(device)
        self.pool_rows = pool_rows
        self.query = protocol.query_rows(table, device) if protocol is not None else None

    def score(self, pred: np.ndarray) -> dict[str, float]:
        out = {"all": spearman(pred, self.y)}
        if self.query is not None:
            out["help800"] = spearman(pred[self.query], self.y[self.query])
        return out


def run_one(predictor: Any, task: Task, rows: np.ndarray, seed: int
            ) -> tuple[dict, float, float | None]:
    """Adapt to the measurements of ``rows``: (Spearman per protocol, adaptation seconds,
    fraction of all architectures whose table latency lies within 2 predicted standard
    deviations, or ``None`` for a predictor without an uncertainty)."""
    archs = [task.table.archs[i] for i in rows]
    t0 = time.perf_counter()
    predictor.adapt(archs, task.y[rows], seed=seed)
    dt = time.perf_counter() - t0
    mean, std = predictor.predict_with_std(task.table.archs)
    cover = None if std is None else float(np.mean(np.abs(task.y - mean) <= 2 * std))
    return task.score(mean), dt, cover


#: measurements the shipped predictor is chosen for (what hwnas users are told to take)
SHIP_N = 10


def select_pretrained(table: LatencyTable, protocol: FewShotProtocol, pool: np.ndarray,
                      metas: list[MetaPredictor]) -> tuple[int, list[float]]:
    """The seed whose meta predictor ranks the VALIDATION devices best with its first
    :data:`SHIP_N` reference architectures (mean Spearman over all architectures), and every
    seed's score. Meta-training seeds differ in their reference architectures, and one draw
    can suit some devices badly; the shipped predictor is chosen on validation devices only,
    never on test devices."""
    tasks = [Task(table, d, protocol, pool) for d in protocol.validation]
    scores = []
    for seed, meta in enumerate(metas):
        rows = table.rows(meta.reference_archs[:SHIP_N])
        trial = copy.deepcopy(meta)  # the shipped predictor stays un-adapted
        scores.append(float(np.mean([run_one(trial, t, rows, seed)[0]["all"] for t in tasks])))
    return int(np.argmax(scores)), scores


def evaluate(space: Any, tasks: list[Task], metas: list[MetaPredictor | None],
             help_rows: np.ndarray | None, predictors: list[str], ns: list[int],
             seeds: int, metas_v1: list[MetaPredictor | None] | None = None,
             lowranks: list[LowRankPredictor | None] | None = None
             ) -> dict[tuple, dict[str, list]]:
    """scores[(predictor, device, n, protocol)] = per-seed values; plus adapt times.
    ``metas_v1`` (one per seed) are the previous version's predictors, for ``meta[v1]``;
    ``lowranks`` (one per seed) the low-rank prior predictors, for ``lowrank`` (its own
    reference architectures) and ``lowrank[random]``."""
    from tqdm import tqdm

    acc: dict[tuple, dict[str, list]] = defaultdict(lambda: {"rho": [], "sec": [], "cover": []})
    bar = tqdm(total=len(tasks) * seeds, desc=f"{space.name}", leave=False)
    for task in tasks:
        for seed in range(seeds):
            rng = np.random.default_rng(10_000 + seed)
            random_rows = rng.permutation(task.pool_rows)[: max(ns)]
            meta = metas[seed]
            for name in predictors:
                for n in ns:
                    if name in BASELINES:
                        pred, rows = get_predictor(name, space), random_rows[:n]
                        if n < pred.min_samples:
                            continue
                    elif name == "meta[v1]":
                        old = metas_v1[seed] if metas_v1 else None
                        refs = old.reference_archs[:n] if old is not None else []
                        if len(refs) < n or any(a not in task.table for a in refs):
                            continue
                        pred, rows = old, task.table.rows(refs)
                    elif name.startswith("lowrank"):
                        low = lowranks[seed] if lowranks else None
                        if low is None:
                            continue
                        if name == "lowrank[random]":
                            pred, rows = low, random_rows[:n]
                        else:
                            refs = low.reference_archs[:n]
                            if len(refs) < n or any(a not in task.table for a in refs):
                                continue
                            pred, rows = low, task.table.rows(refs)
                    elif meta is None:
                        continue
                    elif name == "meta":
                        refs = meta.reference_archs[:n]
                        if len(refs) < n or any(a not in task.table for a in refs):
                            continue  # the table lacks a reference architecture
                        pred, rows = meta, task.table.rows(refs)
                    elif name == "meta[random]":
                        pred, rows = meta, random_rows[:n]
                    elif name == "meta[help-refs]":
                        if help_rows is None or n != len(help_rows):
                            continue
                        pred, rows = meta, help_rows
                    else:
                        raise UserError(f"unknown predictor {name!r}")
                    scores, dt, cover = run_one(pred, task, rows, seed)
                    for protocol, rho in scores.items():
                        acc[(name, task.device, n, protocol)]["rho"].append(rho)
                        acc[(name, task.device, n, protocol)]["sec"].append(dt)
                        if cover is not None:
                            acc[(name, task.device, n, protocol)]["cover"].append(cover)
            bar.update(1)
    bar.close()
    return acc


def to_rows(space_name: str, acc: dict, split: str) -> list[dict]:
    rows = []
    for (name, device, n, protocol), v in sorted(acc.items(), key=lambda kv: (
            ALL_PREDICTORS.index(kv[0][0]) if kv[0][0] in ALL_PREDICTORS else 99, kv[0][1:])):
        rho = np.asarray(v["rho"])
        rows.append({"space": space_name, "predictor": name, "device": device,
                     "n_measurements": n, "protocol": protocol,
                     "spearman_mean": round(float(rho.mean()), 4),
                     "spearman_std": round(float(rho.std()), 4), "seeds": len(rho),
                     "adapt_seconds": round(float(np.mean(v["sec"])), 5), "split": split})
        if v["cover"]:  # all architectures, so the same for every protocol of the row
            rows[-1]["within_2sd"] = round(float(np.mean(v["cover"])), 3)
    return rows


def print_tables(space_name: str, rows: list[dict], devices: list[str],
                 published: dict[str, float] | None, ns: list[int]) -> None:
    by = {(r["predictor"], r["device"], r["n_measurements"], r["protocol"]): r for r in rows}
    names = [p for p in ALL_PREDICTORS if any(r["predictor"] == p for r in rows)]
    protocols = sorted({r["protocol"] for r in rows}, key=["all", "help800"].index)
    for protocol in protocols:
        print(f"\n{space_name} - Spearman, 10 measurements, protocol {protocol} "
              f"(mean ± std over seeds)")
        head = f"{'predictor':<16}" + "".join(f"{d:>16}" for d in devices) + f"{'mean':>9}"
        print(head)
        for p in names:
            cells, means = [], []
            for d in devices:
                r = by.get((p, d, 10, protocol))
                if r is None:
                    cells.append(f"{'-':>16}")
                    continue
                means.append(r["spearman_mean"])
                cells.append(f"{r['spearman_mean']:>9.3f}±{r['spearman_std']:.3f}")
            mean = f"{np.mean(means):>9.3f}" if len(means) == len(devices) else f"{'-':>9}"
            print(f"{p:<16}" + "".join(cells) + mean)
        if published:
            print(f"{'HELP (paper)':<16}" + "".join(f"{published.get(d, float('nan')):>16.3f}"
                                                    for d in devices)
                  + f"{published.get('mean', float('nan')):>9.3f}")
        print(f"  curve (mean over devices) for n = {ns}:")
        for p in names:
            vals = []
            for n in ns:
                rs = [by[(p, d, n, protocol)]["spearman_mean"] for d in devices
                      if (p, d, n, protocol) in by]
                vals.append(f"{np.mean(rs):.3f}" if len(rs) == len(devices) else "  -  ")
            t = [by[k]["adapt_seconds"] for k in by if k[0] == p and k[3] == protocol]
            print(f"    {p:<16}" + "  ".join(vals) + f"   adapt {np.mean(t) * 1e3:.1f} ms")
    print("  table latency within 2 predicted std, 10 measurements (all architectures):")
    for p in names:
        cover = [by.get((p, d, 10, "all"), {}).get("within_2sd") for d in devices]
        if any(c is not None for c in cover):
            print(f"    {p:<16}" + "".join(f"{d}: {c:.2f}  " for d, c in zip(devices, cover)
                                             if c is not None))


def summaries(rows: list[dict], devices_by_space: dict[str, list[str]]) -> list[dict]:
    out = []
    keys = sorted({(r["space"], r["predictor"], r["n_measurements"], r["protocol"])
                   for r in rows})
    for space, p, n, protocol in keys:
        sel = [r for r in rows if (r["space"], r["predictor"], r["n_measurements"],
                                   r["protocol"]) == (space, p, n, protocol)]
        if len(sel) != len(devices_by_space[space]):
            continue
        out.append({"space": space, "predictor": p, "n_measurements": n, "protocol": protocol,
                    "spearman_mean_over_devices": round(float(np.mean(
                        [r["spearman_mean"] for r in sel])), 4),
                    "adapt_seconds_max": max(r["adapt_seconds"] for r in sel)})
    return out


def meta_fit(space: Any, table: LatencyTable, protocol: FewShotProtocol,
             seed: int, **options: Any) -> MetaPredictor:
    rows = protocol.meta_train_rows(table)
    archs = [table.archs[i] for i in rows]
    tabs = {d: table.column(d)[rows] for d in protocol.meta_train}
    return MetaPredictor(space, **options).meta_fit(space, archs, tabs, seed=seed)


def _lofo_module() -> Any:
    """``benchmarks/latency_lofo.py`` (imported as a package module or beside this script)."""
    try:
        from benchmarks import latency_lofo
    except ImportError:
        import latency_lofo
    return latency_lofo


def lowrank_fit(space: Any, table: LatencyTable, protocol: FewShotProtocol,
                seed: int) -> LowRankPredictor:
    """The low-rank prior predictor meta-trained on the protocol's meta-training devices (each
    device family weighs the same: :func:`latency_lofo.family`)."""
    family = _lofo_module().family
    rows = protocol.meta_train_rows(table)
    archs = [table.archs[i] for i in rows]
    tabs = {d: table.column(d)[rows] for d in protocol.meta_train}
    return LowRankPredictor(space).meta_fit(space, archs, tabs, seed=seed,
                                            groups={d: family(d) for d in tabs})


def lofo_rows(lofo: dict) -> list[dict]:
    """One row per (space, predictor, measurements, held-out family) of a
    ``benchmarks/latency_lofo.py`` result (its family means over the family's devices), in this
    file's row layout: ``protocol`` ``lofo-<family>``, ``device`` the family, ``predictor``
    with ``[random]`` for 10 random measurements; and one ``lofo-mean`` / ``lofo-worst`` row."""
    out = []
    by: dict[tuple, list[dict]] = defaultdict(list)
    for r in lofo["results"]:
        by[(r["space"], r["predictor"], r["measurements"], r["family"])].append(r)
    for (space, p, meas, fam), rs in sorted(by.items()):
        name = LOFO_NAMES.get(p, p) + ("[random]" if meas == "random" else "")
        out.append({"space": space, "predictor": name, "device": fam, "family": fam,
                    "devices": sorted(r["device"] for r in rs),
                    "n_measurements": rs[0]["n_measurements"], "protocol": f"lofo-{fam}",
                    "spearman_mean": round(float(np.mean([r["spearman_mean"] for r in rs])), 4),
                    "spearman_std": round(float(np.mean([r["spearman_std"] for r in rs])), 4),
                    "seeds": rs[0]["seeds"], "adapt_seconds": (
                        round(float(np.mean([r["adapt_seconds"] for r in rs])), 4)
                        if all("adapt_seconds" in r for r in rs) else None),
                    "split": "lofo"})
    for s in lofo["summary"]:
        name = LOFO_NAMES.get(s["predictor"], s["predictor"]) + (
            "[random]" if s["measurements"] == "random" else "")
        for what, key in (("mean", "spearman_mean"), ("worst", "worst_spearman")):
            out.append({"space": s["space"], "predictor": name, "device": (
                "all families" if what == "mean" else s["worst_family"]),
                "n_measurements": s["n_measurements"], "protocol": f"lofo-{what}",
                "spearman_mean": s[key], "spearman_std": None, "seeds": None,
                "adapt_seconds": None, "split": "lofo"})
    return out


def write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    os.chmod(tmp, 0o644)  # mkstemp creates 0600
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spaces", nargs="+", default=["nb201", "fbnet"])
    ap.add_argument("--predictors", nargs="+", default=list(ALL_PREDICTORS),
                    choices=list(ALL_PREDICTORS))
    ap.add_argument("--n", nargs="+", type=int, default=[2, 5, 10, 20])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--split", choices=["test", "validation"], default="test")
    ap.add_argument("--latency-csv", type=Path, help="score a new table (same CSV layout)")
    ap.add_argument("--device", help="the device column of --latency-csv to score")
    ap.add_argument("--space", help="space of --latency-csv (default nb201)", default="nb201")
    ap.add_argument("--out", type=Path, default=None,
                    help=f"JSON to write (default {OUT_JSON.name} for the test split; "
                         f"nothing for --latency-csv or the validation split)")
    ap.add_argument("--min-profile-r2", type=float, default=None,
                    help="MetaPredictor min_profile_r2 (meta-train only on devices whose profile "
                         "predicts held-out cells with at least this R^2; default: its default)")
    ap.add_argument("--pair-profiles", type=float, default=None,
                    help="MetaPredictor pair_profiles (a second set of meta-training profiles "
                         "with pairwise cell terms, weighed by evidence; default: its default, off)")
    ap.add_argument("--lofo", nargs="*", default=None, metavar="LOFO_JSON",
                    help="add the family protocol's rows (leave-one-family-out, "
                         "benchmarks/latency_lofo.py): from the LOFO_JSON files (one per space, "
                         "say), or run it (--spaces, --seeds draws, all its predictors) when "
                         "no file is given")
    ap.add_argument("--write-pretrained", action="store_true",
                    help="save the meta (and lowrank) predictors of --predictors to "
                         "latency/data/: per space the seed whose predictor ranks the "
                         "validation devices best (n = 10)")
    args = ap.parse_args(argv)
    try:
        return _main(args, argv if argv is not None else sys.argv[1:])
    except UserError as exc:
        print(f"latency_fewshot: error: {exc}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace, argv: list[str]) -> int:
    if args.seeds < 1 or any(n < 1 for n in args.n):
        raise UserError("--seeds and --n must be positive")
    if args.latency_csv is not None:
        return _custom(args, argv)
    if args.device:
        raise UserError("--device needs --latency-csv")
    lofo_docs = _lofo_files(args.lofo or [])  # bad files fail before any work
    t_start = time.time()
    all_rows: list[dict] = []
    devices_by_space: dict[str, list[str]] = {}
    for space_name in args.spaces:
        space = get_space(space_name)
        protocol = help_protocol(space_name)
        table = load_shared_table(space_name, space=space)
        devices = list(protocol.test if args.split == "test" else protocol.validation)
        devices_by_space[space_name] = devices
        pool = protocol.meta_train_rows(table)
        tasks = [Task(table, d, protocol, pool) for d in devices]
        need_meta = any(p.startswith("meta") and p != "meta[v1]" for p in args.predictors)
        t0 = time.time()
        opts = {k: v for k, v in (("min_profile_r2", args.min_profile_r2),
                                  ("pair_profiles", args.pair_profiles)) if v is not None}
        metas = [meta_fit(space, table, protocol, s, **opts) if need_meta else None
                 for s in range(args.seeds)]
        metas_v1 = [meta_fit(space, table, protocol, s, **V1_OPTIONS)
                    for s in range(args.seeds)] if "meta[v1]" in args.predictors else None
        lowranks = [lowrank_fit(space, table, protocol, s) for s in range(args.seeds)] \
            if any(p.startswith("lowrank") for p in args.predictors) else None
        print(f"{space_name}: meta-trained {args.seeds} predictors in {time.time() - t0:.1f} s "
              f"(features included)", flush=True)
        if args.write_pretrained:
            for kind, preds in (("meta", metas), ("lowrank", lowranks or [None])):
                if preds[0] is None:
                    continue
                best, val = select_pretrained(table, protocol, pool, preds)
                path = preds[best].save(pretrained_path(space_name, kind))
                check = LatencyPredictor.load(path)
                assert check.reference_archs == preds[best].reference_archs
                print(f"{space_name}: validation-device mean Spearman (n = {SHIP_N}) per "
                      f"meta-training seed of {kind} {[round(v, 4) for v in val]} -> wrote "
                      f"seed {best}'s predictor to {path} ({path.stat().st_size} bytes)")
        if metas[0] is not None and len(metas[0].variants) > 1:
            print(f"{space_name}: execution variants {metas[0].variants}, per meta-training "
                  f"device {dict(zip(metas[0].devices_, metas[0].device_execution_))}")
        acc = evaluate(space, tasks, metas, protocol.reference_rows(table), args.predictors,
                       args.n, args.seeds, metas_v1, lowranks)
        rows = to_rows(space_name, acc, args.split)
        all_rows += rows
        print_tables(space_name, rows, devices,
                     protocol.published if args.split == "test" else None, args.n)
    lofo_source = None
    if args.lofo is not None:
        lofo_source = []
        for lofo in lofo_docs or _lofo_run(args):
            lofo_source.append(lofo.get("command"))
            all_rows += lofo_rows(lofo)
    elapsed = time.time() - t_start
    print(f"\ntotal {elapsed:.0f} s")
    out = args.out or (OUT_JSON if args.split == "test" else None)
    if out is not None:
        doc = {
            "command": "python benchmarks/latency_fewshot.py " + " ".join(argv),
            "machine": machine(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "default_predictor": DEFAULT_PREDICTOR,
            "split": args.split,
            "elapsed_seconds": round(elapsed, 1),
            "protocol": {s: {"meta_train": list(help_protocol(s).meta_train),
                             "validation": list(help_protocol(s).validation),
                             "test": list(help_protocol(s).test),
                             "query_range": list(help_protocol(s).query_range),
                             "help_published_spearman_10_samples": help_protocol(s).published}
                         for s in args.spaces},
            "summary": summaries(all_rows, devices_by_space),
            "lofo_source": lofo_source,
            "results": all_rows,
        }
        write_json(out, doc)
        print(f"wrote {out}")
    return 0


def _lofo_files(names: list[str]) -> list[dict]:
    """The family protocol's results read from ``--lofo`` files (checked)."""
    docs = []
    for name in names:
        path = Path(name)
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot read the family-protocol results {path}: {exc}") from exc
        if not isinstance(doc, dict) or not {"results", "summary"} <= set(doc):
            raise UserError(f"{path} is not a benchmarks/latency_lofo.py result; expected "
                            f"'results' and 'summary' keys")
        docs.append(doc)
    return docs


def _lofo_run(args: argparse.Namespace) -> list[dict]:
    """The family protocol computed now (--spaces, --seeds draws, all its predictors)."""
    out = Path(tempfile.mkdtemp()) / "latency_lofo.json"
    _lofo_module().main(["--spaces", *args.spaces, "--seeds", str(args.seeds),
                         "--out", str(out)])
    return [json.loads(out.read_text())]


def _custom(args: argparse.Namespace, argv: list[str]) -> int:
    """Score the column ``--device`` of ``--latency-csv`` (an unseen device) like a test device."""
    if not args.device:
        raise UserError("--latency-csv needs --device COLUMN (the device column to score)")
    space = get_space(args.space)
    table = load_latency_table(args.latency_csv, space=space, devices=[args.device])
    if len(table) < max(args.n) + 2:
        raise UserError(f"{args.latency_csv} has {len(table)} architectures; scoring with up to "
                        f"{max(args.n)} measurements needs at least {max(args.n) + 2}")
    task = Task(table, args.device, None, np.arange(len(table)))
    try:
        meta = load_pretrained(space.name)
    except UserError as exc:
        print(f"note: {exc}; the meta predictor is skipped")
        meta = None
    if meta is not None:
        protocol = help_protocol(space.name) if space.name in ("nb201", "fbnet") else None
        if protocol and args.device in protocol.meta_train:
            print(f"note: {args.device} is one of the meta-training devices; it is not unseen")
        missing = [a for a in meta.reference_archs[: max(args.n)] if a not in table]
        if missing:
            print(f"note: the table lacks {len(missing)} of the meta predictor's first "
                  f"{max(args.n)} reference architectures; 'meta' is scored only for the n "
                  f"whose first n are all present, 'meta[random]' always")
    predictors = [p for p in args.predictors if p not in ("meta[help-refs]", "meta[v1]")]
    acc = evaluate(space, [task], [meta] * args.seeds, None, predictors, args.n, args.seeds)
    rows = to_rows(space.name, acc, "custom")
    print_tables(space.name, rows, [args.device], None, args.n)
    if args.out is not None:
        write_json(args.out, {
            "command": "python benchmarks/latency_fewshot.py " + " ".join(argv),
            "machine": machine(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "default_predictor": DEFAULT_PREDICTOR,
            "latency_csv": str(args.latency_csv),
            "results": rows,
        })
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
