"""What a search leaves in its run directory, computed from the study's completed trials.

* ``trials.csv`` / ``trials.parquet`` (:func:`trials_frame`): one row per completed trial,
  every metric, the Optuna parameters, ``feasible`` and ``pareto``.
* ``pareto_<device>.csv`` (:func:`device_front`): per device, the feasible non-dominated
  candidates when every latency objective is that device's latency.
* ``hypervolume.csv`` (:func:`hypervolume_history`): per device, the 2-D hypervolume after each
  trial.
* ``fronts.png`` (front per device, dominated trials grey) and ``devices.png`` (the same
  Pareto models' latencies across devices, relative to the fastest of them on each device).

Reading a run: :func:`device_ranks` (the union of the fronts with each model's latency rank on
every device) and :func:`select_under_budget` (the most accurate model within a latency budget
on one device). No torch here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from hwnas.search.objectives import Constraint, Metric
from hwnas.search.pareto import hypervolume_2d
from hwnas.search.rundir import RunDir

from hwnas.core.errors import UserError
from hwnas.core.io import write_atomic

TRIAL_COLUMNS = ("trial", "arch", "policy", "bits", "seed")


def pareto_mask(values: np.ndarray, directions: Sequence[str]) -> np.ndarray:
    """Boolean mask of the non-dominated rows of ``values`` (n x k) under ``directions``
    ("maximize"/"minimize"); identical rows are all kept."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return np.zeros(len(v), dtype=bool)
    signs = np.array([-1.0 if d == "maximize" else 1.0 for d in directions])
    v = v * signs  # everything minimised
    mask = np.ones(len(v), dtype=bool)
    for i in range(len(v)):
        if not mask[i]:
            continue
        dominated = np.all(v <= v[i], axis=1) & np.any(v < v[i], axis=1)
        if dominated.any():
            mask[i] = False
    return mask


def trials_frame(study, devices: Sequence[str], objectives: Sequence[Metric],
                 constraints: Sequence[Constraint], metric_columns: Sequence[str]) -> pd.DataFrame:
    """One row per completed trial (``trials.csv``): number, arch string, policy (JSON, empty =
    float), a short bit summary, the seed label, every metric (``metric_columns``, e.g.
    :func:`hwnas.search.evaluator.metric_columns`: accuracy, size, BOPs, FLOPs, params, average
    weight bits, latency and its std on every device), the Optuna parameters (``param:<name>``),
    ``feasible`` (all constraints met) and ``pareto`` (non-dominated for the study's own
    objectives)."""
    from hwnas.search.bits import describe_bits
    from hwnas.search.evaluator import policy_from_text
    from hwnas.search.study import completed

    rows = []
    for t in completed(study):
        ua = t.user_attrs
        row = {"trial": t.number, "arch": ua.get("arch", ""), "policy": ua.get("policy", ""),
               "bits": describe_bits(policy_from_text(ua.get("policy", ""))),
               "seed": ua.get("seed", "")}
        row.update({c: ua.get(c, np.nan) for c in metric_columns})
        row.update({f"param:{k}": v for k, v in t.params.items()})
        rows.append(row)
    params = sorted({k for r in rows for k in r if k.startswith("param:")})
    frame = pd.DataFrame(rows, columns=[*TRIAL_COLUMNS, *metric_columns, *params])
    frame = frame.astype({c: "float64" for c in metric_columns})
    frame["feasible"] = feasible_mask(frame, constraints)
    frame["pareto"] = front_mask(frame, [m.column for m in objectives],
                                 [m.direction for m in objectives])
    return frame


def feasible_mask(frame: pd.DataFrame, constraints: Sequence[Constraint]) -> np.ndarray:
    ok = np.ones(len(frame), dtype=bool)
    for c in constraints:
        ok &= np.array([c.satisfied(v) for v in frame[c.metric.column]], dtype=bool)
    return ok


def front_mask(frame: pd.DataFrame, columns: Sequence[str], directions: Sequence[str]) -> np.ndarray:
    """Non-dominated feasible rows; of repeated (arch, policy) rows only the first counts."""
    mask = np.zeros(len(frame), dtype=bool)
    if frame.empty:
        return mask
    candidates = frame["feasible"].to_numpy() if "feasible" in frame else np.ones(len(frame), bool)
    first = ~frame.duplicated(subset=["arch", "policy"]).to_numpy()
    idx = np.flatnonzero(candidates & first)
    if len(idx):
        mask[idx] = pareto_mask(frame.iloc[idx][list(columns)].to_numpy(), directions)
    return mask


def device_objectives(objectives: Sequence[Metric], device: str) -> list[Metric]:
    """The search's objectives with every latency objective replaced by ``device``'s latency
    (accuracy and latency always included)."""
    out = [Metric("accuracy")] + [Metric("latency", device)]
    for m in objectives:
        if m.name not in ("accuracy", "latency") and m not in out:
            out.append(m)
    return out


def device_front(frame: pd.DataFrame, device: str, objectives: Sequence[Metric]) -> pd.DataFrame:
    """The Pareto front for ``device`` (``pareto_<device>.csv``), fastest first: the feasible
    candidates that are non-dominated when every latency objective is that device's latency
    (accuracy vs latency on the device, plus the search's non-latency objectives such as size);
    repeats of one (arch, policy) count once."""
    metrics = device_objectives(objectives, device)
    mask = front_mask(frame, [m.column for m in metrics], [m.direction for m in metrics])
    return frame[mask].sort_values(f"latency_ms:{device}").reset_index(drop=True)


def hypervolume_history(frame: pd.DataFrame, devices: Sequence[str]) -> pd.DataFrame:
    """Per device, the 2-D hypervolume (accuracy up, latency down) of the feasible trials after
    each completed trial; reference point: the lowest accuracy and 1.01 x the highest latency
    over all trials."""
    rows = []
    ordered = frame.sort_values("trial")
    acc = ordered["accuracy"].to_numpy()
    feasible = ordered["feasible"].to_numpy() if "feasible" in ordered else np.ones(len(ordered), bool)
    for d in devices:
        lat = ordered[f"latency_ms:{d}"].to_numpy()
        if not len(lat):
            continue
        ref_acc, ref_lat = float(np.nanmin(acc)), float(np.nanmax(lat)) * 1.01
        for i in range(len(ordered)):
            sel = feasible[: i + 1]
            hv = hypervolume_2d(lat[: i + 1][sel], acc[: i + 1][sel], ref_lat, ref_acc)
            rows.append({"device": d, "trials": i + 1, "trial": int(ordered["trial"].iloc[i]),
                         "hypervolume": hv, "ref_accuracy": ref_acc, "ref_latency_ms": ref_lat})
    return pd.DataFrame(rows, columns=["device", "trials", "trial", "hypervolume",
                                       "ref_accuracy", "ref_latency_ms"])


def closest_infeasible(frame: pd.DataFrame, constraints: Sequence[Constraint], n: int = 3) -> pd.DataFrame:
    """The ``n`` trials closest to meeting every constraint (smallest summed relative
    violation), for the message when none meets them."""
    if frame.empty or not constraints:
        return frame.head(0)
    total = np.zeros(len(frame))
    for c in constraints:
        v = np.array([max(0.0, c.violation(x)) for x in frame[c.metric.column]])
        total += v / max(abs(c.bound), 1e-12)
    return frame.assign(violation=total).nsmallest(n, "violation")


def write_frame(path: Path, frame: pd.DataFrame) -> Path:
    """Atomic CSV (or Parquet, by suffix) write."""
    if path.suffix == ".parquet":
        return write_atomic(path, lambda tmp: frame.to_parquet(tmp, index=False))
    return write_atomic(path, lambda tmp: frame.to_csv(tmp, index=False))




def summary_table(front: pd.DataFrame, device: str, max_rows: int = 12) -> str:
    """A device's front as a readable table, fastest first."""
    if front.empty:
        return "  (no feasible Pareto-optimal trials)"
    f = front.head(max_rows)
    cols = {
        "trial": f["trial"],
        "val acc %": f["accuracy"].map("{:.1f}".format),
        f"ms on {device}": f[f"latency_ms:{device}"].map("{:.3f}".format),
        "size KiB": (f["size_bytes"] / 1024).map("{:.1f}".format),
        "bits": f["bits"],
    }
    if "accuracy_supernet" in f:
        cols["val acc % (predicted)"] = cols.pop("val acc %")
        cols["val acc % (supernet)"] = f["accuracy_supernet"].map("{:.1f}".format)
    if "test_accuracy" in f:
        cols["test acc %"] = f["test_accuracy"].map("{:.1f}".format)
    cols["arch"] = f["arch"].map(lambda s: s if len(s) <= 60 else s[:57] + "...")
    text = pd.DataFrame(cols).to_string(index=False)
    if len(front) > max_rows:
        text += f"\n  ... {len(front) - max_rows} more in {RunDir(Path()).pareto(device).name}"
    return text


def _latency_devices(frame: pd.DataFrame) -> list[str]:
    return [c.split(":", 1)[1] for c in frame.columns if c.startswith("latency_ms:")]


def select_under_budget(front: pd.DataFrame, device: str, max_latency_ms: float) -> pd.Series:
    """The most accurate model of ``front`` whose latency on ``device`` (column
    ``latency_ms:<device>``) is at most ``max_latency_ms``; ties go to the faster, then the
    smaller model. ``front`` is a device's Pareto front (``SearchResult.fronts[device]``,
    ``pareto_<device>.csv``) or all trials (infeasible rows and rows without a latency are
    skipped). Returns the chosen row; UserError when the device has no latency column, the
    budget is not a positive number of milliseconds, or no model fits (the message names the
    fastest one)."""
    column = f"latency_ms:{device}"
    if column not in front.columns:
        known = ", ".join(_latency_devices(front)) or "none"
        raise UserError(f"no latency on device {device!r} in this table (no column {column}); "
                        f"devices: {known}")
    if (isinstance(max_latency_ms, bool) or not isinstance(max_latency_ms, (int, float, np.number))
            or not math.isfinite(max_latency_ms) or max_latency_ms <= 0):
        raise UserError(f"latency budget must be a positive number of milliseconds, got "
                        f"{max_latency_ms!r}")
    latency = pd.to_numeric(front[column], errors="coerce")
    usable = latency.notna() & pd.to_numeric(front["accuracy"], errors="coerce").notna()
    if "feasible" in front.columns:
        usable &= front["feasible"].astype(bool)
    if not usable.any():
        raise UserError(f"no model with a latency on {device} to choose from (empty front?)")
    fits = front[usable & (latency <= max_latency_ms)]
    if fits.empty:
        fastest = front.loc[latency[usable].idxmin()]
        raise UserError(f"no model runs within {max_latency_ms:g} ms on {device}; the fastest, "
                        f"trial {int(fastest['trial'])}, takes {fastest[column]:.4g} ms")
    keys = ["accuracy", column] + (["size_bytes"] if "size_bytes" in fits.columns else [])
    ranked = fits.sort_values(keys, ascending=[False] + [True] * (len(keys) - 1), kind="stable")
    return ranked.iloc[0]


def device_ranks(fronts: Mapping[str, pd.DataFrame],
                 trials: pd.DataFrame | None = None) -> pd.DataFrame:
    """How the same models rank on different devices: the union of the devices' Pareto fronts
    (``SearchResult.fronts``), or every trial of ``trials`` when given, each (arch, policy)
    once, most accurate first, with for each device D its latency ``latency_ms:D``, ``rank:D``
    (1 = the fastest of these models on D) and ``front:D`` (whether the model is on D's
    front)."""
    devices = list(fronts)
    frames = [trials] if trials is not None else [f for f in fronts.values() if not f.empty]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=["trial", "accuracy", "bits", "size_bytes", "arch"]
                            + [f"{k}:{d}" for d in devices for k in ("latency_ms", "rank", "front")])
    union = pd.concat(frames, ignore_index=True).drop_duplicates(subset=["arch", "policy"])
    union = union.sort_values(["accuracy", "trial"], ascending=[False, True], kind="stable")
    base = [c for c in ("trial", "accuracy", "test_accuracy", "bits", "size_bytes", "arch")
            if c in union.columns]
    out = union[base].reset_index(drop=True)
    for d in devices:
        column = f"latency_ms:{d}"
        latency = union[column].to_numpy(float) if column in union.columns \
            else np.full(len(union), np.nan)
        out[column] = latency
        out[f"rank:{d}"] = pd.Series(latency).rank(method="min").astype("Int64")
        on_front = set(zip(fronts[d]["arch"], fronts[d]["policy"])) if len(fronts[d]) else set()
        out[f"front:{d}"] = [k in on_front for k in zip(union["arch"], union["policy"])]
    return out
