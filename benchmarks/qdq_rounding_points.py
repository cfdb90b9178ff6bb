"""Figures for qdq_divergence.md, session 37 (every rounding point of the reference traced): the
mbv3 net of ``tests/test_export_code_trace.py`` (SE and h-swish, 512 random 8x8 images), its
code trace before (requantization and residual points only), after (every
``DeployedReference.rounding_points()``), and after without the h-sigmoid's x = 0 mask, on the
exported file and on copies with one rounding point's scale nudged or wrong.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/qdq_rounding_points.py
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from hwnas.export.code_trace import trace_codes  # noqa: E402
from hwnas.export.qdq.build import build_qdq  # noqa: E402
from hwnas.quant.policy import uniform  # noqa: E402
from qdq_support import tiny_mbv3_se  # noqa: E402
from test_export_code_trace import _scaled  # noqa: E402


def main() -> None:
    t0 = time.process_time()
    model, calib, test = tiny_mbv3_se(512)
    build = build_qdq(model, uniform(model, 8, 8), [calib])
    proto, ref = build.proto(), build.reference()
    points = ref.rounding_points()
    node = {p.name: p.node for p in points}
    before = [p for p in points if p.kind in ("requant", "residual")]
    unmasked = [dataclasses.replace(p, live=None) for p in points]

    def verdict(traced, point=None, factor=1.0) -> str:
        data = _scaled(proto, node[point], factor) if point else proto.SerializeToString()
        with ref as deployed:
            t = trace_codes(data, deployed, test, points=traced)
        if t.unexplained:
            return f"{len(t.layers)} traced, {t.unexplained} ({t.unexplained_distance_to_half:.3f})"
        return f"{len(t.layers)} traced, " + ("flips only" if t.differs else "exact")

    kinds = ("requant", "residual", "se_gate", "hsigmoid", "hswish")
    print("points:", {k: sum(p.kind == k for p in points) for k in kinds})
    for label, point, factor in [("exact file", None, 1.0),
                                 ("gate x(1+2e-5)", "blocks.1.se.gate.se_gate", 1 + 2e-5),
                                 ("gate x1.1", "blocks.1.se.gate.se_gate", 1.1),
                                 ("hsig x(1+2e-5)", "blocks.0.act1.hsigmoid", 1 + 2e-5),
                                 ("hsig x1.1", "blocks.0.act1.hsigmoid", 1.1),
                                 ("hswish out x1.1", "blocks.1.act2.hswish", 1.1)]:
        print(f"{label} | before: {verdict(before, point, factor)} | after: "
              f"{verdict(points, point, factor)} | no mask: {verdict(unmasked, point, factor)}")
    with ref as deployed:
        t = trace_codes(proto.SerializeToString(), deployed, test, points=unmasked)
    print("no mask, exact file:", next(r for r in t.layers if r["layer"] == "stem_act.hsigmoid"))
    cpu: dict[str, list[float]] = {"before": [], "after": []}
    for _ in range(4):  # interleaved: the machine is shared
        for key, traced in (("before", before), ("after", points)):
            with ref as deployed:
                start = time.process_time()
                trace_codes(proto.SerializeToString(), deployed, test, points=traced)
                cpu[key].append(round(time.process_time() - start, 2))
    print("trace CPU s, exact file:", cpu)
    print(f"CPU {time.process_time() - t0:.1f} s")


if __name__ == "__main__":
    main()
