"""Average several sessions of one latency table into one table.

A CPU table's anchors remove each round's overall speed, but cells still move between sessions
(on the 2-core VMs two sessions of the same 2,000 NB-201 architectures agree at Spearman
0.77-0.96 per runtime); averaging sessions is the one remedy for that noise that does not
depend on a model. Each session is a folder written by ``measure_latency_tables.py`` (same
space, tag and devices). Per device, each session's anchor-normalised column is scaled to the
first session's level (the median log ratio over the architectures both hold: a session's
overall speed says nothing about the architectures), then each cell is the geometric mean over
the sessions that hold it. Its variation is the root sum of squares of the sessions' cv over
their number (the cv of a mean of independent timings). ``<space>_<out-tag>_sessions.json``
records the sessions, the scale factors and the sessions' Spearman per device.

    python benchmarks/merge_table_sessions.py S1 S2 --space nb201 --tag epyc \\
        --out latency/data/tables --cv-out benchmarks/results/latency_tables --out-tag epyc1t

The averaged table and its ``_sessions.json`` are what hwnas reads (package data,
``latency/data/tables``); the ``_cv`` table is benchmark evidence (``--cv-out``, default ``--out``).
"""

from __future__ import annotations

import argparse
import sys
from itertools import combinations
from pathlib import Path

import numpy as np

from hwnas.core.io import write_json
from hwnas.core.maths import spearman

try:  # run as a script, benchmarks/ is on sys.path; loaded by a test, the repo root is
    from compare_table_sessions import read_columns
    from measure_latency_tables import write_csv_gz
except ModuleNotFoundError:
    from benchmarks.compare_table_sessions import read_columns
    from benchmarks.measure_latency_tables import write_csv_gz


def _read_session(folder: Path, space: str, tag: str) -> tuple[dict, dict]:
    """``(times, cv)``: ``device -> {arch: ms}`` (anchor-normalised) and ``device -> {arch: cv}``
    (empty where the session has no cv file)."""
    path = folder / f"{space}_{tag}.csv.gz"
    if not path.is_file():
        raise ValueError(f"{folder}: no {path.name} (expected a folder written by "
                         f"measure_latency_tables.py with --spaces {space} --tag {tag})")
    cv_path = folder / f"{space}_{tag}_cv.csv.gz"
    return read_columns(path), read_columns(cv_path) if cv_path.is_file() else {}


def merge(folders: list[Path], space: str, tag: str) -> tuple[list[str], list[str], np.ndarray,
                                                               np.ndarray, dict]:
    """``(devices, archs, ms, cv, record)`` of the averaged table; ``ms``/``cv`` are
    (archs, devices) arrays, NaN where no session holds the cell (cv: or none has a cv)."""
    if len(folders) < 2:
        raise ValueError(f"give at least two session folders to merge, got {len(folders)}")
    sessions = [_read_session(f, space, tag) for f in folders]
    devices = list(sessions[0][0])
    for f, (times, _) in zip(folders[1:], sessions[1:]):
        if set(times) != set(devices):
            raise ValueError(f"{f}: devices {sorted(times)} differ from {folders[0]}'s "
                             f"{sorted(devices)}; sessions of one table measure the same devices")
    archs = list(dict.fromkeys(a for times, _ in sessions for col in times.values() for a in col))
    index = {a: i for i, a in enumerate(archs)}
    ms = np.full((len(archs), len(devices)), np.nan)
    cv = np.full_like(ms, np.nan)
    record: dict = {"sessions": [str(f) for f in folders], "space": space, "tag": tag,
                    "devices": {}}
    for j, d in enumerate(devices):
        logs = np.full((len(sessions), len(archs)), np.nan)
        cvs = np.full_like(logs, np.nan)
        for k, (times, cv_k) in enumerate(sessions):
            for a, v in times[d].items():
                if not v > 0:
                    raise ValueError(f"{folders[k]}: {d} has a non-positive time {v} for {a}")
                logs[k, index[a]] = np.log(v)
            for a, v in cv_k.get(d, {}).items():
                cvs[k, index[a]] = v
        scales = [0.0]
        for k in range(1, len(sessions)):
            both = ~np.isnan(logs[0]) & ~np.isnan(logs[k])
            if not both.any():
                raise ValueError(f"{folders[k]} and {folders[0]} hold no architecture of {d} "
                                 "in common: their levels cannot be matched")
            shift = float(np.median(logs[0, both] - logs[k, both]))
            logs[k] += shift
            scales.append(shift)
        held = ~np.isnan(logs)
        n = held.sum(axis=0)
        ms[:, j] = np.where(n > 0, np.exp(np.nansum(logs, axis=0) / np.maximum(n, 1)), np.nan)
        has_cv = ~np.isnan(cvs)
        cv[:, j] = np.where(has_cv.any(axis=0),
                            np.sqrt(np.nansum(cvs**2, axis=0)) / np.maximum(has_cv.sum(axis=0), 1),
                            np.nan)
        pairs = {}
        for a, b in combinations(range(len(sessions)), 2):
            both = held[a] & held[b]
            pairs[f"{a + 1}-{b + 1}"] = round(spearman(logs[a, both], logs[b, both]), 4)
        record["devices"][d] = {
            "scale_to_session_1": [round(float(np.exp(s)), 4) for s in scales],
            "spearman_between_sessions": pairs,
            "architectures": int((n > 0).sum()),
            "architectures_in_every_session": int((n == len(sessions)).sum()),
        }
    return devices, archs, ms, cv, record


def _fmt(v: float) -> str:
    return "" if np.isnan(v) else f"{v:.6g}"


def write(out: Path, space: str, out_tag: str, devices: list[str], archs: list[str],
          ms: np.ndarray, cv: np.ndarray, record: dict, cv_out: Path | None = None) -> list[Path]:
    """Write the averaged table and the sessions' record to ``out``, its cv table to ``cv_out``
    (default ``out``), each file atomically."""
    cv_out = cv_out or out
    for folder in (out, cv_out):
        folder.mkdir(parents=True, exist_ok=True)
    targets = [out / f"{space}_{out_tag}.csv.gz", cv_out / f"{space}_{out_tag}_cv.csv.gz",
               out / f"{space}_{out_tag}_sessions.json"]
    for target, values in zip(targets, (ms, cv)):
        write_csv_gz(target, ["arch", *devices],
                     [[a, *(_fmt(v) for v in row)] for a, row in zip(archs, values)])
    write_json(targets[2], record)
    return targets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sessions", type=Path, nargs="+", help="session folders, the first sets the level")
    ap.add_argument("--space", default="nb201")
    ap.add_argument("--tag", required=True, help="the tag the sessions were measured with")
    ap.add_argument("--out", type=Path, required=True,
                    help="folder of the averaged table and its _sessions.json")
    ap.add_argument("--cv-out", type=Path, help="folder of the _cv table (default: --out)")
    ap.add_argument("--out-tag", help="machine tag of the averaged table (default: --tag)")
    args = ap.parse_args(argv)
    try:
        devices, archs, ms, cv, record = merge(args.sessions, args.space, args.tag)
    except ValueError as exc:
        print(f"merge_table_sessions: {exc}", file=sys.stderr)
        return 2
    paths = write(args.out, args.space, args.out_tag or args.tag, devices, archs, ms, cv, record,
                  args.cv_out)
    for d, row in record["devices"].items():
        print(f"{d:24s} {row['architectures']:5d} archs ({row['architectures_in_every_session']} "
              f"in every session)  scale {row['scale_to_session_1']}  "
              f"spearman {row['spearman_between_sessions']}")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
