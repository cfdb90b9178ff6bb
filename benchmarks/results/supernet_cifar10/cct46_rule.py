"""Session 46's rule for a lever on the CCT supernet (``supernet_cifar10.md`` "Session 46":
``--teacher-scope all``; "Session 52": ``--regularise largest``), applied to a finished run's
``eval.json`` against the shipped file's run (``cct45/cctsnkd200``).

Written before the run finished, so that the decision is read off, not argued: ship the new
supernet only if its smallest >= 84.73 (item 2's adjusted line), its largest >= 89.86 (the
shipped 90.06 less 0.2) and the mean of its five evaluated subnets >= the shipped run's (86.91,
computed from the reference file). The five subnets must be the same architectures as the
reference's, on the same 10,000 test images, with the training completed; anything else is
refused with one line (exit 2)::

    python benchmarks/results/supernet_cifar10/cct46_rule.py RUN/eval.json \
        [--reference benchmarks/results/supernet_cifar10/cct45/cctsnkd200/eval.json]

Prints the table and ``SHIP`` (exit 0) or ``KEEP`` (exit 1).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SMALLEST_LINE = 84.73
LARGEST_MARGIN = 0.2
REFERENCE = Path(__file__).parent / "cct45" / "cctsnkd200" / "eval.json"


class RuleError(ValueError):
    """The two evaluations do not compare (other subnets, images or an unfinished run)."""


def _subnets(path: Path) -> tuple[dict, dict[str, dict]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RuleError(f"{path}: not a readable eval.json ({exc})") from exc
    rows = {row["role"]: row for row in data.get("subnets", [])}
    return data, rows


def decide(run: Path, reference: Path = REFERENCE) -> tuple[bool, list[str]]:
    """(ship?, report lines) for the run's eval.json against the reference's."""
    new, new_rows = _subnets(run)
    ref, ref_rows = _subnets(reference)
    if not new.get("training_completed"):
        raise RuleError(f"{run}: training_completed is not true (an unfinished run is not ruled on)")
    if (new.get("split"), new.get("images")) != (ref.get("split"), ref.get("images")):
        raise RuleError(f"{run}: evaluated on {new.get('split')}/{new.get('images')} images, "
                        f"expected {ref.get('split')}/{ref.get('images')} as the reference")
    if set(new_rows) != set(ref_rows) or len(ref_rows) != 5:
        raise RuleError(f"{run}: subnets {sorted(new_rows)}, expected the reference's five "
                        f"{sorted(ref_rows)}")
    for role, row in ref_rows.items():
        if new_rows[role]["arch"] != row["arch"]:
            raise RuleError(f"{run}: {role} is {new_rows[role]['arch']}, expected {row['arch']}")
    mean_new = sum(r["top1"] for r in new_rows.values()) / 5
    mean_ref = round(sum(r["top1"] for r in ref_rows.values()) / 5, 2)
    largest_line = round(ref_rows["largest"]["top1"] - LARGEST_MARGIN, 2)
    checks = [
        ("smallest", new_rows["smallest"]["top1"], SMALLEST_LINE),
        ("largest", new_rows["largest"]["top1"], largest_line),
        ("mean of five", round(mean_new, 2), mean_ref),
    ]
    lines = ["| subnet | reference | run |", "|---|---:|---:|"]
    lines += [f"| {role} | {ref_rows[role]['top1']:.2f} | {new_rows[role]['top1']:.2f} |"
              for role in ref_rows]
    lines.append("")
    lines += [f"{name}: {value:.2f} >= {line:.2f}: {'yes' if value >= line else 'NO'}"
              for name, value, line in checks]
    ship = all(value >= line for _, value, line in checks)
    lines.append("SHIP" if ship else "KEEP (and take the lever's option out of the library)")
    return ship, lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="the finished run's eval.json")
    ap.add_argument("--reference", type=Path, default=REFERENCE)
    args = ap.parse_args(argv)
    try:
        ship, lines = decide(args.run, args.reference)
    except RuleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0 if ship else 1


if __name__ == "__main__":
    sys.exit(main())
