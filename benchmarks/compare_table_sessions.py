"""How well two measurements of the same latency table agree: per device, the Spearman between
the two tables' columns over the architectures both hold (anchors left out: their rows are
medians over every round), for the raw times and for the anchor-normalised ones.

Tables are those of ``benchmarks/measure_latency_tables.py`` (``<space>_<tag>.csv.gz``, and
with anchors ``<space>_<tag>_raw.csv.gz``); a table measured without anchors has only raw
times, used for both. Two sessions of the same architectures that agree better normalised than
raw show drift that the anchors removed.

    python benchmarks/compare_table_sessions.py DIR_A DIR_B --space nb201 --tag xeon
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from hwnas.core.maths import spearman

try:  # run as a script, benchmarks/ is on sys.path; loaded by a test, the repo root is
    from measure_latency_tables import read_csv_gz
except ModuleNotFoundError:
    from benchmarks.measure_latency_tables import read_csv_gz


def read_columns(path: Path) -> dict[str, dict[str, float]]:
    """``device -> {arch: value}`` of a table with one column per device after ``arch``
    (empty cells left out)."""
    rows = read_csv_gz(path)
    return {d: {r[0]: float(r[i]) for r in rows[1:] if r[i] != ""}
            for i, d in enumerate(rows[0]) if i}


def read_table(folder: Path, space: str, tag: str) -> tuple[dict, dict, set[str]]:
    """``(normalised, raw, anchors)``: ``device -> {arch: ms}`` twice and the anchor rows."""
    norm = read_columns(folder / f"{space}_{tag}.csv.gz")
    raw_path = folder / f"{space}_{tag}_raw.csv.gz"
    if not raw_path.is_file():
        return norm, norm, set()
    raw_rows = read_csv_gz(raw_path)
    cols = raw_rows[0]
    raw = {d: {r[0]: float(r[i]) for r in raw_rows[1:]} for i, d in enumerate(cols) if i > 1}
    return norm, raw, {r[0] for r in raw_rows[1:] if r[1] == "anchor"}


def compare(a: Path, b: Path, space: str, tag: str) -> dict:
    """Per device: architectures in common (anchors excluded), raw and normalised Spearman."""
    norm_a, raw_a, anc_a = read_table(a, space, tag)
    norm_b, raw_b, anc_b = read_table(b, space, tag)
    out = {}
    for d in norm_a:
        if d not in norm_b:
            continue
        common = sorted((set(norm_a[d]) & set(norm_b[d])) - anc_a - anc_b)
        row = {"architectures": len(common)}
        for name, x, y in (("raw", raw_a, raw_b), ("normalised", norm_a, norm_b)):
            row[name] = round(spearman(np.array([x[d][k] for k in common]),
                                       np.array([y[d][k] for k in common])), 4)
        out[d] = row
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--space", default="nb201")
    ap.add_argument("--tag", required=True)
    args = ap.parse_args(argv)
    res = compare(args.a, args.b, args.space, args.tag)
    for d, row in res.items():
        print(f"{d:24s} n={row['architectures']:5d}  raw {row['raw']:.3f}  "
              f"normalised {row['normalised']:.3f}")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
