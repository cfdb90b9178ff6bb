"""Figures for qdq_divergence.md, session 38 (the reference and the file's float layers): for
every layer of the two-stage mbv3 (SE, h-swish) and of a one-block fbnet of
``tests/qdq_support.py`` kept float in turn (the mixed builds a device rule or policy gives),
whether the element-wise rewrite the reference mirrors (``QdqBuild.reference().rewrite``) is
the graph of the file (``QdqBuild.proto()``), and the code trace of the file against it; then
the session-37 note's case literally: a file with a layer kept float that the build does not
know of (``proto(extra_float=...)``, a timing variant) through ``verify_qdq``.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/qdq_reference_float_layers.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from hwnas.export.code_trace import trace_codes  # noqa: E402
from hwnas.export.passes import ImagePasses  # noqa: E402
from hwnas.export.qdq.build import build_qdq  # noqa: E402
from hwnas.export.records import ExportSettings, FileReport  # noqa: E402
from hwnas.export.verify import verify_qdq  # noqa: E402
from hwnas.quant.policy import uniform  # noqa: E402
from qdq_support import tiny_fbnet, tiny_mbv3_se  # noqa: E402

from hwnas.core.errors import UserError  # noqa: E402


def mixed(label: str, model, calib, test) -> tuple[int, int]:  # noqa: ANN001
    """(builds whose reference mirrors the file's graph, builds) over each layer kept float."""
    names = uniform(model, 8, 8).layer_names
    same = 0
    for fl in [[]] + [[n] for n in names]:
        build = build_qdq(model, uniform(model, 8, 8), [calib], example=calib[:1],
                          float_layers=fl)
        proto, ref = build.proto(), build.reference()
        equal = ref.rewrite.proto.graph == proto.graph
        with ref as deployed:
            tr = trace_codes(proto.SerializeToString(), deployed, test,
                             points=ref.rounding_points())
        same += equal and tr.unexplained is None
        print(f"{label} float={','.join(fl) or '-':24s} graph_equal={equal} "
              f"points={len(ref.rounding_points())} "
              f"max|file-ref|={float(np.abs(tr.logits - tr.reference).max()):.2e} "
              f"unexplained={tr.unexplained}", flush=True)
    return same, len(names) + 1


def main() -> None:
    torch.set_num_threads(1)
    t0 = time.process_time()
    mbv3, fbnet = tiny_mbv3_se(64), tiny_fbnet("skip-k3_e1_g2", (1, 1), 64)
    counts = [mixed("mbv3", *mbv3), mixed("fbnet", *fbnet)]
    print("mirrored and flips only:", counts)
    model, calib, _ = mbv3
    test = tiny_mbv3_se(512)[2]
    build = build_qdq(model, uniform(model, 8, 8), [calib], example=calib[:1])
    for fl in ([], ["blocks.1.expand_conv"], ["blocks.1.dw_conv"], ["blocks.2.expand_conv"]):
        report = FileReport("x.onnx", "qdq", "")
        try:
            verify_qdq(build.proto(extra_float=fl), build, ImagePasses(test), report,
                       ExportSettings(), requantize=True, require_integer=False)
            verdict = "passed"
        except UserError as exc:
            verdict = f"refused: {str(exc)[:60]}"
        print(f"verify_qdq, all-int8 build, file with extra_float={fl}: {verdict}; "
              f"top-1 {report.top1_agreement}, max diff {report.max_abs_diff}", flush=True)
    print(f"CPU {time.process_time() - t0:.1f} s")


if __name__ == "__main__":
    main()
