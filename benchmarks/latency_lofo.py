"""Leave-one-family-out (LOFO): the development protocol for latency predictors (issue 23.2).

A user's new device is, by definition, not of a family the meta-training set has seen, so every
device is grouped by family (:func:`family`: desktop GPU, server CPU, phone, single-board
computer, simulated accelerator, and for the measured tables shipped with hwnas
(``latency/data/tables``; their ``_cv`` files stay in ``benchmarks/results/latency_tables``)
each runtime on each machine, e.g. ``xeon-ort`` or ``h200-cudagraph``). One family at a time is
held out; the meta predictor is meta-trained on every other device and adapted to 10
measurements of each held-out device, and ranks ALL architectures of that device's table
(Spearman). Measurements are either the meta predictor's first 10 reference architectures
(``ref``: what ``hwnas latency reference`` hands a user; one draw per fold, the same 10 for
every predictor) or 10 random architectures of the device's table (``random``, ``--seeds``
draws). A family's score is the mean over its devices; the summary is the mean over families
and the worst family. HELP's split stays the published comparison
(``benchmarks/latency_fewshot.py``); this is the number to develop on.

Rows (predictors): ``meta`` (the project's default, default settings), ``flops``, ``opcount``
(a constant plus a non-negative cost per operation, NNLS: 6 parameters on NB-201, 10 on FBNet)
and candidates (see ``latency_lofo.md``): ``meta+opcount``, the mean of the two predictions
after scaling each to the measured mean, and ``meta|opcount``, whichever of the two has the lower
leave-one-out log error on the 10 measurements; ``lowrank`` (:class:`LowRankPredictor`: a
low-rank prior over the meta-training devices' per-operation cost vectors, each family weighing
the same, measured on its own reference architectures) and ``meta+lowrank`` (the mean of the
two predictions' ranks); ``ens-loo``, meta, lowrank and opcount weighted by their leave-one-out
error on the device's own 10 measurements. Beside them, ``ceiling[fit]``, ``ceiling[most]``,
``ceiling[cv]``, ``ceiling[sessions]`` and ``ceiling[stated]``: each held-out device's ceiling
estimates (``latency_ceiling.py``, :func:`ceiling_rows`), and every row's ``clean`` mean
over the families whose split-half ceiling is >= 0.95 (where the predictor, not the table's
noise, is the limit). Meta-training uses every architecture some table
holds (a device measured on a sample is fitted on its sample) and one seed per fold; when a
held-out table lacks a reference architecture, the references are chosen again among the
architectures every held-out table holds (``MetaPredictor.redesign``).

    OMP_NUM_THREADS=1 python benchmarks/latency_lofo.py --spaces nb201 fbnet

``--execution-known onnx|declared`` pins the execution variant of the measured families whose
runtime says it (:data:`EXECUTION_KNOWN`), as ``hwnas latency adapt`` does for measurements of
ONNX files or with ``--execution``.

Development runs may score on a seeded subsample of each large table (``--score-subsample``)
and skip the ceilings (``--no-ceiling``, ``--ceiling-from`` an earlier run's JSON).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import io
import re
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from hwnas.core.io import write_json
from hwnas.latency.devices import packaged_tables_dir, reliability, session_agreement
from hwnas.latency.machine import describe_machine
from hwnas.latency.predictors import (
    FlopsPredictor,
    LowRankPredictor,
    MetaPredictor,
    OpCountPredictor,
)
from hwnas.latency.tables import load_shared_table
from hwnas.supernet.spaces import get_space

try:  # run as a script (benchmarks/ on sys.path) or imported as benchmarks.latency_lofo
    import latency_ceiling as ceiling
except ImportError:  # pragma: no cover - depends on how it is run
    from benchmarks import latency_ceiling as ceiling

REPO = Path(__file__).resolve().parent.parent
#: the measured tables, read from the installed package like any user does
TABLES_DIR = packaged_tables_dir()
#: their per-cell variation (``<space>_<tag>_cv.csv.gz``), beside the rest of the evidence
CV_DIR = REPO / "benchmarks" / "results" / "latency_tables"
OUT_JSON = Path(__file__).with_suffix(".json")
PREDICTORS = ("meta", "flops", "opcount", "gbm", "gp", "meta+opcount", "meta|opcount",
              "lowrank", "meta+lowrank", "ens-loo")
#: processor kinds for ``--kinds`` (the "device unlike the training families" view): each
#: held out with every family of it at once
KINDS = {"arm-like": ("phone", "single-board"),
         "gpu": ("desktop-gpu", "h200-torch", "h200-cudagraph"),
         "accelerator": ("simulated-accel",),
         "x86-cpu": ("server-cpu", "xeon-*", "epyc-*", "vm-*")}
#: a family whose split-half ceiling reaches this is one where the predictor, not the data,
#: limits the score (``clean_mean``: the mean over those families)
CLEAN_CEILING = 0.95
_META_ROWS = {"meta", "meta+opcount", "meta|opcount", "meta+lowrank", "ens-loo"}
_LOWRANK_ROWS = {"lowrank", "meta+lowrank", "ens-loo"}
N = 10

#: HELP's device columns -> family (regular expressions, first match wins)
HELP_FAMILIES = (
    (r"^(1080ti|2080ti|titan_rtx|titanxp|titanx)_\d+$", "desktop-gpu"),
    (r"^(gold|silver)_\d+\w*$", "server-cpu"),
    (r"^(pixel\d|samsung_\w+|essential_ph_1)$", "phone"),
    (r"^raspi\d$", "single-board"),
    (r"^(eyeriss|fpga)$", "simulated-accel"),
)


def family(device: str) -> str:
    """The family of a device column: HELP's by :data:`HELP_FAMILIES`; a measured table's
    ``<machine>-<runtime>-<setting>`` by ``<machine>-<runtime>`` (each runtime on each machine
    is its own family); anything else is its own family."""
    for pattern, fam in HELP_FAMILIES:
        if re.match(pattern, device):
            return fam
    parts = device.split("-")
    return "-".join(parts[:2]) if len(parts) >= 3 else device


#: ``--execution-known``: what a user can tell ``hwnas latency adapt`` about how a measured
#: family (``<machine>-<runtime>``) ran the network, as runtimes of
#: :data:`~hwnas.latency.predictors.features.RUNTIME_DROPS_DEAD_CODE`. ``onnx``: the runtimes
#: that time hwnas's ONNX exports, which hold no dead operations -- what ``adapt`` infers by
#: itself from the ``file`` column of ``ondevice.py``; ``declared``: also the runtimes whose
#: behaviour a user knows and passes as ``--execution``. HELP's families are never pinned (how
#: they ran is not recorded).
FAMILY_RUNTIMES = {"ort": "onnxruntime", "ov": "openvino", "ts": "torchscript",
                   "torch": "pytorch", "cudagraph": "cudagraph"}
EXECUTION_KNOWN = {"onnx": ("ort", "ov"), "declared": tuple(FAMILY_RUNTIMES)}


def known_execution(space: Any, fam: str, mode: str | None) -> str | None:
    """The execution variant ``mode`` (:data:`EXECUTION_KNOWN`) pins for the measured family
    ``fam``, or None (weighed by the measurements)."""
    from hwnas.latency.predictors.features import execution_variants, runtime_execution

    if mode is None or len(execution_variants(space)) < 2 or fam.count("-") != 1:
        return None
    runtime = fam.split("-")[1]
    if runtime not in EXECUTION_KNOWN[mode]:
        return None
    return runtime_execution(space, FAMILY_RUNTIMES[runtime])


def read_gz_table(path: Path, space: Any) -> dict[str, dict[str, float]]:
    """``device -> {canonical arch: ms}`` of a ``.csv.gz`` table of measure_latency_tables.py."""
    import csv

    rows = list(csv.reader(io.StringIO(gzip.decompress(path.read_bytes()).decode())))
    head, body = rows[0], rows[1:]
    out: dict[str, dict[str, float]] = {d: {} for d in head[1:]}
    for r in body:
        a = space.to_string(space.from_string(r[0]))
        for d, v in zip(head[1:], r[1:]):
            if v and np.isfinite(float(v)) and float(v) > 0:
                out[d][a] = float(v)
    return out


def load_cv(space: Any, *dirs: Path | None) -> dict[str, dict[str, float]]:
    """``device -> {canonical arch: cv}``: the coefficient of variation of each cell's repeated
    timings (``<space>_*_cv.csv.gz`` of ``dirs``, default :data:`CV_DIR`; HELP's tables have
    none)."""
    out: dict[str, dict[str, float]] = {}
    dirs = dirs or (CV_DIR,)
    paths = sorted(p for d in dirs if d is not None for p in d.glob(f"{space.name}_*_cv.csv.gz"))
    for path in paths:
        out.update(read_gz_table(path, space))
    return out


def ceiling_rows(space: Any, fam: str, held: list[str], devices: dict,
                 cvs: dict[str, dict[str, float]], most: bool = True,
                 agreement: dict[str, tuple[int, float]] | None = None) -> list[dict]:
    """Rows ``ceiling[fit]`` (split-half), ``ceiling[most]`` (5-fold, unless ``most`` is
    False; tables under twice ``latency_ceiling.MAX_TRAIN``, the others' halves train on
    that many already), where repeats were timed ``ceiling[cv]`` and where several sessions were averaged
    ``ceiling[sessions]`` (``agreement``: device -> (sessions, median Spearman between two,
    :func:`session_agreements`) of the held-out devices (:mod:`latency_ceiling`), in the shape
    of the predictors' rows."""
    agreement = agreement or {}
    rows = []
    for d in held:
        archs, y = devices[d]
        feats = ceiling.ceiling_features(space, archs)
        fit = ceiling.split_half(feats, y)
        base = {"space": space.name, "predictor": "ceiling", "n_measurements": N,
                "family": fam, "device": d, "architectures": len(archs), "spearman_std": 0.0,
                "seeds": 1}
        rows.append({**base, "measurements": "fit", "spearman_mean": round(fit["best"], 4),
                     "models": {k: round(v, 4) for k, v in fit.items() if k != "best"}})
        if d in cvs:
            cv = np.array([cvs[d].get(a, np.nan) for a in archs])
            rows.append({**base, "measurements": "cv",
                         "spearman_mean": round(ceiling.repeat_ceiling(y, cv), 4)})
        if most and len(archs) < 2 * ceiling.MAX_TRAIN:  # else the halves train on thousands
            fit = ceiling.most_fit(feats, y)
            rows.append({**base, "measurements": "most", "spearman_mean": round(fit["best"], 4),
                         "models": {k: round(v, 4) for k, v in fit.items() if k != "best"}})
        stated = max(r["spearman_mean"] for r in rows
                     if r["device"] == d and r["measurements"] in ("fit", "most"))
        if d in agreement:
            k, rho = agreement[d]
            stated = round(ceiling.sessions_ceiling(k, rho), 4)
            rows.append({**base, "measurements": "sessions", "sessions": k,
                         "session_spearman": round(rho, 4), "spearman_mean": stated})
        # the ceiling stated per device: the sessions' where several were averaged, else the
        # best model's (with thousands of measurements on HELP's tables, close to the noise)
        rows.append({**base, "measurements": "stated", "spearman_mean": stated})
    return rows


def ceiling_rows_from(path: Path, spaces: list[str], families: list[str] | None) -> list[dict]:
    """The ``ceiling`` rows of an earlier run's JSON (the spaces and families asked for)."""
    import json

    from hwnas.core.errors import UserError

    try:
        doc = json.loads(path.read_text())
        rows = [r for r in doc["results"] if r["predictor"] == "ceiling"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"--ceiling-from {path}: expected a latency_lofo JSON with ceiling rows "
                        f"({e})") from None
    return [r for r in rows if r["space"] in spaces
            and (not families or r["family"] in families)]


def load_devices(space: Any, tables_dir: Path | None = TABLES_DIR,
                 min_reliability: float = 0.0) -> tuple[dict, list[str]]:
    """Every device of the space: ``device -> (archs, latency array)``; and the sources read.
    HELP's table first, then ``<space>_*.csv.gz`` (not the ``_cv``, ``_raw`` and ``_anchors``
    ones) of ``tables_dir``. ``min_reliability``: leave out a measured column whose averaged
    sessions' Spearman-Brown reliability (:func:`hwnas.latency.devices.reliability`) is below
    it (a one-session column, whose reliability is unknown, is kept)."""
    help_table = load_shared_table(space.name, space=space)
    devices = {d: (list(help_table.archs), help_table.column(d)) for d in help_table.devices}
    sources = [f"HELP {space.name} table ({len(help_table)} architectures)"]
    paths = [] if tables_dir is None else sorted(tables_dir.glob(f"{space.name}_*.csv.gz"))
    for path in paths:
        if path.name.endswith(("_cv.csv.gz", "_raw.csv.gz", "_anchors.csv.gz")):
            continue  # per-cell variation, raw (unnormalised) times, anchor measurements
        left_out = []
        for d, cells in read_gz_table(path, space).items():
            archs = list(cells)
            agreement = session_agreement(path, d)
            worth = 1.0 if agreement is None else reliability(*agreement)
            if worth < min_reliability:
                left_out.append(f"{d} {worth:.2f}")
                continue
            devices[d] = (archs, np.array([cells[a] for a in archs]))
        shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        sources.append(f"{shown} ({len(archs)} architectures"
                       + (f"; left out, reliability below {min_reliability:g}: "
                          f"{', '.join(left_out)}" if left_out else "") + ")")
    return devices, sources


def session_agreements(space: Any, tables_dir: Path | None = TABLES_DIR
                       ) -> dict[str, tuple[int, float]]:
    """``device -> (sessions averaged, median Spearman between two)`` of every measured column
    of ``tables_dir`` that averages several sessions (:func:`session_agreement`)."""
    out = {}
    paths = [] if tables_dir is None else sorted(tables_dir.glob(f"{space.name}_*.csv.gz"))
    for path in paths:
        if path.name.endswith(("_cv.csv.gz", "_raw.csv.gz", "_anchors.csv.gz")):
            continue
        head = gzip.decompress(path.read_bytes()).decode().split("\n", 1)[0]
        for d in head.strip().split(",")[1:]:
            agreement = session_agreement(path, d)
            if agreement is not None:
                out[d] = agreement
    return out


def nan_columns(devices: dict, names: list[str], archs: list[str]) -> dict[str, np.ndarray]:
    """Each named device's latencies over ``archs`` (every architecture its table holds must be
    among them), NaN where it was not measured: the meta-training input of tables of different
    samples."""
    pos = {a: i for i, a in enumerate(archs)}
    cols = {}
    for d in names:
        measured, y = devices[d]
        cols[d] = np.full(len(archs), np.nan)
        cols[d][[pos[x] for x in measured]] = y
    return cols


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import spearmanr

    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return 0.0
    return float(spearmanr(a, b)[0])


def combined(meta: MetaPredictor, space: Any, archs: list[str], y: np.ndarray,
             query: list[str], m: np.ndarray, seed: int) -> np.ndarray:
    """``meta+opcount``: mean of the meta (``m``, its prediction on ``query``) and op-count
    predictions, each divided by its mean over the measured architectures (so both are on the
    measurements' scale)."""
    oc = OpCountPredictor(space).adapt(archs, y, seed=seed)
    o = oc.predict(query)
    m_fit, o_fit = meta.predict(archs), oc.predict(archs)
    return 0.5 * (m / max(np.mean(m_fit), 1e-12) + o / max(np.mean(o_fit), 1e-12))


def loo_log_error(make: Any, archs: list[str], y: np.ndarray, seed: int) -> float:
    """Mean absolute log error of leave-one-out predictions on the measurements themselves."""
    errs = []
    for i in range(len(archs)):
        keep = [j for j in range(len(archs)) if j != i]
        p = make().adapt([archs[j] for j in keep], y[keep], seed=seed).predict([archs[i]])[0]
        errs.append(abs(np.log(max(p, 1e-12) / y[i])))
    return float(np.mean(errs))


def loo_ensemble(members: dict[str, tuple[Any, np.ndarray | None]], archs: list[str],
                 y: np.ndarray, query: list[str], seed: int) -> np.ndarray:
    """``ens-loo``: a weighted geometric mean of the members' predictions on ``query`` (each
    divided by its mean over the measured architectures), weights ``1 / e^2`` with ``e`` the
    member's leave-one-out mean absolute log error on the measurements: the choice is made per
    device, from its own measurements. ``members``: name -> (predictor, its prediction on
    ``query`` when it is already adapted to all measurements, else None)."""
    logs, weights = [], []
    for pred, full in members.values():
        err = []
        for i in range(len(archs)):
            keep = [j for j in range(len(archs)) if j != i]
            p = pred.adapt([archs[j] for j in keep], y[keep], seed=seed).predict([archs[i]])[0]
            err.append(abs(np.log(max(p, 1e-12) / y[i])))
        pred.adapt(archs, y, seed=seed)
        full = pred.predict(query) if full is None else full
        fit = pred.predict(archs)
        logs.append(np.log(np.maximum(full, 1e-12) / max(float(np.mean(fit)), 1e-12)))
        weights.append(1.0 / (float(np.mean(err)) ** 2 + 1e-6))
    w = np.array(weights) / np.sum(weights)
    return np.exp(np.tensordot(w, np.array(logs), 1))


def arch_features(space: Any, keys: list[str]) -> np.ndarray:
    """The simple baselines' architecture features: the encoding, log1p of the per-layer-kind
    sums and log FLOPs."""
    from hwnas.latency.predictors.features import features

    L = np.log1p(np.maximum(features(space, keys, "layers"), 0.0))
    flops = np.log(np.maximum(features(space, keys, "flops")[:, :1], 1.0))
    return np.hstack([features(space, keys, "encode"), L, flops])


def gbm_baseline(space: Any, archs: list[str], y: np.ndarray, query: list[str],
                 seed: int) -> np.ndarray:
    """``gbm``: scikit-learn's HistGradientBoostingRegressor on :func:`arch_features`, log
    latency, fixed settings (leaves of at least n/10, 2 to 20 measurements)."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    model = HistGradientBoostingRegressor(max_iter=200, learning_rate=0.1, max_leaf_nodes=15,
                                          min_samples_leaf=max(2, min(20, len(y) // 10)),
                                          random_state=seed)
    model.fit(arch_features(space, archs), np.log(y))
    return np.exp(model.predict(arch_features(space, query)))


def gp_baseline(space: Any, archs: list[str], y: np.ndarray, query: list[str],
                seed: int) -> np.ndarray:
    """``gp``: scikit-learn's GaussianProcessRegressor on the standardised encoding and log
    FLOPs, log latency; kernel constant x RBF + linear + white noise, fitted by marginal
    likelihood (one restart)."""
    import warnings

    from hwnas.latency.predictors.features import features
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, DotProduct, WhiteKernel
    from sklearn.gaussian_process.kernels import ConstantKernel as C

    def feats(keys: list[str]) -> np.ndarray:
        flops = np.log(np.maximum(features(space, keys, "flops")[:, :1], 1.0))
        return np.hstack([features(space, keys, "encode"), flops])

    X, Xq = feats(archs), feats(query)
    mu, sd = X.mean(0), X.std(0) + 1e-9
    X, Xq = (X - mu) / sd, (Xq - mu) / sd
    kernel = (C(1.0) * RBF(length_scale=float(np.sqrt(X.shape[1])))
              + C(0.1) * DotProduct(sigma_0=1.0) + WhiteKernel(0.1))
    gp = GaussianProcessRegressor(kernel, normalize_y=True, n_restarts_optimizer=1,
                                  random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gp.fit(X, np.log(y))
    return np.exp(gp.predict(Xq))


def _top_up(first: list[int], order: np.ndarray, n: int) -> list[int]:
    """``first[:n]``, topped up to ``n`` rows with the rows of ``order`` not among them."""
    out = list(first[:n])
    seen = set(out)
    out += [int(i) for i in order if int(i) not in seen][:n - len(out)]
    return out


def rank_mean(*preds: np.ndarray) -> np.ndarray:
    """Mean of the predictions' ranks (an ensemble that only needs each member's order)."""
    from scipy.stats import rankdata

    return np.mean([rankdata(p) for p in preds], 0)


def score_device(space: Any, meta: MetaPredictor | None, archs: list[str], y: np.ndarray,
                 rows: np.ndarray, seed: int, predictors: tuple[str, ...],
                 lowrank: LowRankPredictor | None = None,
                 lowrank_rows: np.ndarray | None = None,
                 times: dict[str, float] | None = None,
                 score: np.ndarray | None = None) -> dict[str, float]:
    """Spearman over all ``archs`` of each predictor adapted to ``rows`` (the low-rank
    predictor to ``lowrank_rows`` when given: its own reference architectures); the seconds
    ``adapt`` took go to ``times`` (meta, lowrank). ``score``: rows to score on (a
    subsample, for development runs), default all."""
    times = {} if times is None else times
    query, yq = (archs, y) if score is None else ([archs[i] for i in score], y[score])
    m_archs, m_y = [archs[i] for i in rows], y[rows]
    out = {}
    pm = pl = None
    if {"meta", "meta+opcount", "meta+lowrank", "ens-loo"} & set(predictors):
        t0 = time.perf_counter()
        meta.adapt(m_archs, m_y, seed=seed)
        times["meta"] = time.perf_counter() - t0
        pm = meta.predict(query)
        if "meta" in predictors:
            out["meta"] = spearman(pm, yq)
        if "meta+opcount" in predictors:
            out["meta+opcount"] = spearman(combined(meta, space, m_archs, m_y, query, pm, seed),
                                           yq)
    if _LOWRANK_ROWS & set(predictors):
        lr = rows if lowrank_rows is None else lowrank_rows
        t0 = time.perf_counter()
        lowrank.adapt([archs[i] for i in lr], y[lr], seed=seed)
        times["lowrank"] = time.perf_counter() - t0
        pl = lowrank.predict(query)
        if "lowrank" in predictors:
            out["lowrank"] = spearman(pl, yq)
        if "meta+lowrank" in predictors:
            out["meta+lowrank"] = spearman(rank_mean(pm, pl), yq)
    if "ens-loo" in predictors:
        t0 = time.perf_counter()
        # every member on the same 10 measurements (under ``ref``, meta's references)
        members = {"meta": (meta, pm), "lowrank": (lowrank, pl if lowrank_rows is None
                                                   else None),
                   "opcount": (OpCountPredictor(space), None)}
        p = loo_ensemble(members, m_archs, m_y, query, seed)
        times["ens-loo"] = time.perf_counter() - t0 + times["meta"] + times["lowrank"]
        out["ens-loo"] = spearman(p, yq)
    if "meta|opcount" in predictors:
        import copy

        e_meta = loo_log_error(lambda: copy.deepcopy(meta), m_archs, m_y, seed)
        e_oc = loo_log_error(lambda: OpCountPredictor(space), m_archs, m_y, seed)
        if e_oc < e_meta:
            p = OpCountPredictor(space).adapt(m_archs, m_y, seed=seed).predict(query)
        else:
            p = meta.adapt(m_archs, m_y, seed=seed).predict(query)
        out["meta|opcount"] = spearman(p, yq)
    if "flops" in predictors:
        out["flops"] = spearman(FlopsPredictor(space).adapt(m_archs, m_y, seed=seed)
                                .predict(query), yq)
    if "opcount" in predictors:
        out["opcount"] = spearman(OpCountPredictor(space).adapt(m_archs, m_y, seed=seed)
                                  .predict(query), yq)
    if "gbm" in predictors:
        out["gbm"] = spearman(gbm_baseline(space, m_archs, m_y, query, seed), yq)
    if "gp" in predictors:
        out["gp"] = spearman(gp_baseline(space, m_archs, m_y, query, seed), yq)
    return out


def follow_up_rows(meta: MetaPredictor, archs: list[str], rnd: np.ndarray, k: int,
                   seed: int) -> dict[str, np.ndarray]:
    """Rows of ``k`` more measurements after the random ``rnd`` ones (``meta`` adapted to
    them): ``random+k``, ``k`` more random architectures; ``random+k-settle``, the ``k`` whose
    latency the predictor expects to differ most between execution variants
    (:meth:`MetaPredictor.settling_archs`), topped up with those random ones once a variant
    is settled. Both measure ``N + k`` architectures: what a user would add after ``adapt``."""
    rest = np.setdiff1d(np.arange(len(archs)), rnd)
    extra = np.random.default_rng(2000 + seed).permutation(rest)
    idx = {a: i for i, a in enumerate(archs)}
    settle = [idx[a] for a in meta.settling_archs([archs[i] for i in rest], k)]
    settle += [i for i in extra if i not in settle][:k - len(settle)]
    return {f"random+{k}": np.concatenate([rnd, extra[:k]]),
            f"random+{k}-settle": np.concatenate([rnd, np.array(settle, dtype=int)])}


def run_space(name: str, seeds: int, predictors: tuple[str, ...], families: list[str] | None,
              meta_options: dict, log: Any, tables_dir: Path | None = TABLES_DIR,
              lowrank_options: dict | None = None,
              with_ceiling: bool = True,
              score_subsample: int | None = None,
              min_reliability: float = 0.0,
              family_prior: bool = False,
              follow_up: int = 0,
              execution_known: str | None = None,
              ns: tuple[int, ...] = (N,),
              held_out_scoring: bool = False,
              kinds: tuple[str, ...] = ()) -> tuple[list[dict], dict]:
    space = get_space(name)
    devices, sources = load_devices(space, tables_dir, min_reliability)
    cv_dirs = (tables_dir, CV_DIR) if tables_dir == TABLES_DIR else (tables_dir,)
    cvs = load_cv(space, *cv_dirs) if with_ceiling else {}
    agreements = session_agreements(space, tables_dir) if with_ceiling else {}
    fams: dict[str, list[str]] = defaultdict(list)
    for d in devices:
        fams[family(d)].append(d)
    # meta-training architectures: every architecture some table holds (a device's profile is
    # fitted on the ones it was measured on, NaN elsewhere)
    all_archs = list(dict.fromkeys(a for archs, _ in devices.values() for a in archs))
    log(f"{name}: {len(devices)} devices in {len(fams)} families, {len(all_archs)} architectures")
    rows: list[dict] = []
    if kinds:  # every family of one processor kind held out at once
        import fnmatch

        folds = {}
        for kind in kinds:
            members = sorted(f for f in fams if any(fnmatch.fnmatch(f, pat)
                                                    for pat in KINDS[kind]))
            if members:
                folds[f"kind:{kind}"] = [d for f in members for d in fams[f]]
    else:
        folds = {f: fams[f] for f in sorted(fams) if not families or f in families}
    for fam, held in folds.items():
        if with_ceiling and not kinds:
            rows += ceiling_rows(space, fam, held, devices, cvs, agreement=agreements)
        if not predictors:
            log(f"  {fam}: ceiling only")
            continue
        train = [d for d in devices if d not in held]
        t0 = time.perf_counter()
        train_set = {a for d in train for a in devices[d][0]}
        train_archs = [a for a in all_archs if a in train_set]
        cols = nan_columns(devices, train, train_archs)
        # the reference architectures must be ones every held-out table holds
        common = set.intersection(*(set(devices[d][0]) for d in held))
        meta = lowrank = None
        refs = lr_refs = None
        use_lowrank = bool(_LOWRANK_ROWS & set(predictors))
        if _META_ROWS & set(predictors) or not use_lowrank:
            meta = MetaPredictor(space, **meta_options).meta_fit(
                space, train_archs, cols, seed=0,
                groups={d: family(d) for d in train} if family_prior else None)
            if not set(meta.reference_archs[:N]) <= common:
                meta.redesign([a for a in train_archs if a in common], seed=0)
            refs = meta.reference_archs
            meta.pin_execution(known_execution(space, fam, execution_known))
        if use_lowrank:
            lowrank = LowRankPredictor(space, **(lowrank_options or {})).meta_fit(
                space, train_archs, cols, seed=0, groups={d: family(d) for d in train})
            if not set(lowrank.reference_archs[:N]) <= common:
                lowrank.redesign([a for a in train_archs if a in common], seed=0)
            lr_refs = lowrank.reference_archs
            refs = refs or lr_refs
        fit_s = time.perf_counter() - t0
        acc: dict[tuple, list[float]] = defaultdict(list)
        sec: dict[tuple, list[float]] = defaultdict(list)
        for d in held:
            archs, y = devices[d]
            idx = {x: i for i, x in enumerate(archs)}
            score = None
            if score_subsample and len(archs) > score_subsample:
                score = np.sort(np.random.default_rng(7).choice(len(archs), score_subsample,
                                                                replace=False))
            for n in ns:
                if held_out_scoring and n + 50 > len(archs):
                    continue  # too few architectures left to score
                own = [idx[a] for a in refs if a in idx]
                lr_own = None if lr_refs is None else [idx[a] for a in lr_refs if a in idx]
                # ref: the predictor's reference architectures the table holds, then random
                # ones beyond them (one draw when the references cover n, else ``seeds``)
                draws = 1 if len(own) >= n and (lr_own is None or len(lr_own) >= n) else seeds
                for kind in ("ref", "random"):
                    for s in range(draws if kind == "ref" else seeds):
                        if n == N and not held_out_scoring:  # the original 10-shot draws
                            rnd = np.random.default_rng(1000 + s).choice(len(archs), N,
                                                                         replace=False)
                        else:
                            rnd = np.random.default_rng(1000 + s).permutation(len(archs))[:n]
                        top = np.random.default_rng(3000 + s).permutation(len(archs))
                        if kind == "ref":
                            rows_k = np.array(_top_up(own, top, n))
                            lr_rows = None if lr_own is None else np.array(
                                _top_up(lr_own, top, n))
                        else:
                            rows_k, lr_rows = rnd, None
                        sc = score
                        if held_out_scoring:  # only architectures none of the rows measured
                            used = set(rows_k.tolist()) | (set() if lr_rows is None
                                                           else set(lr_rows.tolist()))
                            sc = np.array([i for i in (np.arange(len(archs)) if score is None
                                                       else score) if i not in used])
                        times: dict[str, float] = {}
                        for p, v in score_device(space, meta, archs, y, rows_k, s, predictors,
                                                 lowrank, lr_rows, times, sc).items():
                            acc[(p, kind, d, n)].append(v)
                            if p in times:
                                sec[(p, kind, d, n)].append(times[p])
                        if (follow_up and meta is not None and kind == "random" and n == N):
                            for label, rows_f in follow_up_rows(meta, archs, rnd, follow_up,
                                                                s).items():
                                acc[("meta", label, d, n)].append(score_device(
                                    space, meta, archs, y, rows_f, s, ("meta",),
                                    score=score)["meta"])
        for (p, meas, d, n), v in sorted(acc.items()):
            rows.append({"space": name, "predictor": p, "measurements": meas,
                         "n_measurements": n, "family": fam, "device": d,
                         "architectures": len(devices[d][0]),
                         "spearman_mean": round(float(np.mean(v)), 4),
                         "spearman_std": round(float(np.std(v)), 4), "seeds": len(v)})
            if sec.get((p, meas, d, n)):
                rows[-1]["adapt_seconds"] = round(float(np.mean(sec[(p, meas, d, n)])), 4)
                rows[-1]["adapt_seconds_max"] = round(float(np.max(sec[(p, meas, d, n)])), 4)
        fam_rows: dict[tuple, list[float]] = defaultdict(list)
        for r in rows:
            if r["family"] == fam and r["predictor"] != "ceiling":
                fam_rows[(r["predictor"], r["measurements"], r["n_measurements"])].append(
                    r["spearman_mean"])
        log(f"  held out {fam} ({len(held)} devices; meta-fit {fit_s:.0f} s): "
            + ", ".join(f"{p}[{m},{n}] {np.mean(v):.3f}"
                        for (p, m, n), v in sorted(fam_rows.items())))
    info = {"space": name, "sources": sources, "families": {f: sorted(v) for f, v in fams.items()},
            "architectures": len(all_archs)}
    return rows, info


def summarize(rows: list[dict]) -> list[dict]:
    """Per (space, predictor, measurements, number of measurements): each family's mean over
    its devices, then the mean over families and the worst family."""
    out = []
    keys = sorted({(r["space"], r["predictor"], r["measurements"], r.get("n_measurements", N))
                   for r in rows})
    for space, p, m, n in keys:
        by_fam: dict[str, list[float]] = defaultdict(list)
        for r in rows:
            if (r["space"], r["predictor"], r["measurements"], r.get("n_measurements", N)) == (
                    space, p, m, n):
                by_fam[r["family"]].append(r["spearman_mean"])
        fam_means = {f: float(np.mean(v)) for f, v in by_fam.items()}
        worst = min(fam_means, key=fam_means.get)
        out.append({"space": space, "predictor": p, "measurements": m, "n_measurements": n,
                    "family": "mean", "spearman_mean": round(float(np.mean(list(
                        fam_means.values()))), 4),
                    "per_family": {f: round(v, 4) for f, v in sorted(fam_means.items())},
                    "worst_family": worst, "worst_spearman": round(fam_means[worst], 4)})
        secs = [r["adapt_seconds_max"] for r in rows if "adapt_seconds_max" in r and (
            r["space"], r["predictor"], r["measurements"], r["n_measurements"]) == (
                space, p, m, n)]
        if secs:
            out[-1]["adapt_seconds_max"] = max(secs)
    for space in {s["space"] for s in out}:
        ceil = [s for s in out if (s["space"], s["predictor"], s["measurements"])
                == (space, "ceiling", "fit")]
        if not ceil:
            continue
        clean = sorted(f for f, v in ceil[0]["per_family"].items() if v >= CLEAN_CEILING)
        for s in out:
            if s["space"] == space:
                have = [s["per_family"][f] for f in clean if f in s["per_family"]]
                s["clean_families"] = clean
                s["clean_mean"] = round(float(np.mean(have)), 4) if have else None
    return out


def print_table(summary: list[dict]) -> None:
    for space in sorted({s["space"] for s in summary}):
        sel = [s for s in summary if s["space"] == space]
        fams = sorted(sel[0]["per_family"])
        print(f"\n{space} - leave-one-family-out, Spearman after @n measurements "
              f"(family = mean over its devices)")
        print(f"{'predictor':<22}" + "".join(f"{f[:15]:>16}" for f in fams)
              + f"{'mean':>8}{'worst':>8}{'clean':>8}")
        for s in sorted(sel, key=lambda s: (s["n_measurements"], s["measurements"],
                                            PREDICTORS.index(s["predictor"])
                                            if s["predictor"] in PREDICTORS else -1)):
            label = f"{s['predictor']}[{s['measurements']}]" + (
                f"@{s['n_measurements']}" if s["predictor"] != "ceiling" else "")
            print(f"{label:<22}" + "".join(f"{s['per_family'].get(f, float('nan')):>16.3f}"
                                           for f in fams)
                  + f"{s['spearman_mean']:>8.3f}{s['worst_spearman']:>8.3f}"
                  + (f"{s['clean_mean']:>8.3f}" if s.get("clean_mean") is not None else ""))
        if sel[0].get("clean_families") is not None:
            print(f"clean = mean over the families whose split-half ceiling is >= "
                  f"{CLEAN_CEILING}: {', '.join(sel[0]['clean_families'])}")


def print_curve(summary: list[dict]) -> None:
    """The learning curve: each predictor's mean over families (and worst family) per number
    of measurements, and the best baseline's at each."""
    for space in sorted({s["space"] for s in summary}):
        sel = [s for s in summary if s["space"] == space and s["predictor"] != "ceiling"]
        ns = sorted({s["n_measurements"] for s in sel})
        if len(ns) < 2:
            continue
        by = {(s["predictor"], s["measurements"], s["n_measurements"]): s for s in sel}
        print(f"\n{space} - mean over families (worst family) by number of measurements")
        print(f"{'predictor':<18}" + "".join(f"{n:>16}" for n in ns))
        for p, m in sorted({(s["predictor"], s["measurements"]) for s in sel},
                           key=lambda k: (k[1], PREDICTORS.index(k[0])
                                          if k[0] in PREDICTORS else -1)):
            print(f"{p + '[' + m + ']':<18}" + "".join(
                f"{by[(p, m, n)]['spearman_mean']:>9.3f} ({by[(p, m, n)]['worst_spearman']:.2f})"
                if (p, m, n) in by else f"{'-':>16}" for n in ns))


def parse_lowrank_options(opts: list[str]) -> dict[str, Any]:
    """``KEY=V1[,V2...]`` strings -> LowRankPredictor keywords (numbers where they parse; the
    grids and ``targets`` as tuples, the others as one value)."""
    out: dict[str, Any] = {}
    for opt in opts:
        key, _, vals = opt.partition("=")
        values: list[Any] = []
        for v in vals.split(","):
            try:
                values.append(float(v))
            except ValueError:
                values.append(v)
        scalar = key in ("rank", "surrogate_ridge", "n_reference", "pool_size", "pairs",
                         "pair_scale", "temperature", "objective")
        if key in ("rank", "n_reference", "pool_size"):
            values = [int(v) for v in values]
        out[key] = values[0] if scalar else tuple(values)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spaces", nargs="+", default=["nb201"], choices=["nb201", "fbnet"])
    ap.add_argument("--seeds", type=int, default=5, help="draws of the random measurements")
    ap.add_argument("--predictors", nargs="+", default=list(PREDICTORS), choices=PREDICTORS)
    ap.add_argument("--families", nargs="+", default=None, help="hold out only these")
    ap.add_argument("--pool-size", type=int, default=None,
                    help="MetaPredictor pool_size (the design's candidate pool; default its own)")
    ap.add_argument("--meta-option", action="append", default=[], metavar="KEY=V1[,V2...]",
                    help="a MetaPredictor option: a float, or a list with commas "
                         "(opcounts=0,0.3,1; min_profile_r2=0.5)")
    ap.add_argument("--lowrank-option", action="append", default=[], metavar="KEY=V1[,V2...]",
                    help="a LowRankPredictor option (rank=8; targets=linear,log; "
                         "layer_vars=0,0.1,1)")
    ap.add_argument("--help-only", action="store_true",
                    help="HELP's devices only (ignore the measured tables)")
    ap.add_argument("--score-subsample", type=int, default=None, metavar="N",
                    help="score on N seeded architectures of each larger table (development "
                         "runs; final figures over all)")
    ap.add_argument("--no-ceiling", action="store_true",
                    help="skip the noise ceilings (latency_ceiling.py; minutes on HELP's tables)")
    ap.add_argument("--ceiling-from", type=Path, default=None, metavar="JSON",
                    help="with --no-ceiling: take the ceiling rows of an earlier run's JSON "
                         "(for the clean-family mean)")
    ap.add_argument("--ceiling-only", action="store_true",
                    help="only the noise ceilings, no predictor")
    ap.add_argument("--min-reliability", type=float, default=0.0, metavar="R",
                    help="leave out measured columns whose averaged sessions' Spearman-Brown "
                         "reliability is below R (0.5: the registry's noise-level mark)")
    ap.add_argument("--family-prior", action="store_true",
                    help="meta: each meta-training family weighs the same in the prior over "
                         "execution variants (MetaPredictor.meta_fit groups=)")
    ap.add_argument("--follow-up", type=int, default=0, metavar="K",
                    help="meta: also score K more measurements after the random ones, random "
                         "or chosen to settle the execution variant (follow_up_rows)")
    ap.add_argument("--execution-known", choices=sorted(EXECUTION_KNOWN), default=None,
                    help="meta: pin the execution variant of the measured families whose "
                         "runtime says it (EXECUTION_KNOWN), as hwnas latency adapt does")
    ap.add_argument("--n", nargs="+", type=int, default=[N], metavar="N",
                    help="numbers of measurements (default 10); beyond the predictor's "
                         "reference architectures, `ref` tops them up with random ones")
    ap.add_argument("--score-held-out", action="store_true",
                    help="score each adaptation on the architectures it did not measure "
                         "(default: on all, as the 10-shot protocol always did)")
    ap.add_argument("--kinds", nargs="+", default=None, choices=sorted(KINDS),
                    help="hold out every family of one processor kind at once (KINDS) instead "
                         "of one family at a time")
    ap.add_argument("--out", type=Path, default=OUT_JSON)
    args = ap.parse_args(argv)
    if any(n < 2 for n in args.n):
        ap.error("--n: every number of measurements must be at least 2")
    t0 = time.perf_counter()
    log = lambda msg: print(f"[{time.perf_counter() - t0:6.0f} s] {msg}", flush=True)  # noqa: E731
    meta_options: dict[str, Any] = {} if args.pool_size is None else {"pool_size": args.pool_size}
    for opt in args.meta_option:
        key, _, vals = opt.partition("=")
        values = tuple(float(v) for v in vals.split(","))
        meta_options[key] = values if "," in vals else values[0]
    lowrank_options = parse_lowrank_options(args.lowrank_option)
    rows, spaces = [], []
    for name in args.spaces:
        r, info = run_space(name, args.seeds,
                            () if args.ceiling_only else tuple(args.predictors), args.families,
                            meta_options, log, None if args.help_only else TABLES_DIR,
                            lowrank_options, with_ceiling=not args.no_ceiling,
                            score_subsample=args.score_subsample,
                            min_reliability=args.min_reliability,
                            family_prior=args.family_prior, follow_up=args.follow_up,
                            execution_known=args.execution_known, ns=tuple(args.n),
                            held_out_scoring=args.score_held_out,
                            kinds=tuple(args.kinds or ()))
        rows += r
        spaces.append(info)
    if args.ceiling_from is not None:
        rows += ceiling_rows_from(args.ceiling_from, args.spaces, args.families)
    summary = summarize(rows)
    print_table(summary)
    print_curve(summary)
    write_json(args.out, {
        "command": "OMP_NUM_THREADS=1 python benchmarks/latency_lofo.py "
                   + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": describe_machine("no GPU used"),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "n_measurements": args.n, "seeds": args.seeds, "score_subsample": args.score_subsample,
        "score_held_out": args.score_held_out, "kinds": args.kinds,
        "min_reliability": args.min_reliability, "family_prior": args.family_prior,
        "follow_up": args.follow_up, "execution_known": args.execution_known,
        "meta_training": {"seeds_per_fold": 1, "options": meta_options or "defaults",
                          "lowrank_options": lowrank_options or "defaults"},
        "seconds": round(time.perf_counter() - t0, 1),
        "spaces": spaces, "summary": summary, "results": rows})
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
