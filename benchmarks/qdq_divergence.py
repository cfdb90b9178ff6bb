"""Where a QDQ file's logits leave its fake-quant reference: layer by layer, the integer codes
each activation quantizer produces in onnxruntime (the graph's QuantizeLinear outputs) against
the codes the reference (``QdqBuild.reference``: int32 biases, requantization points) produces
on the same test images, plus :func:`hwnas.export.onnx_export.divergence_of`'s verdict.

Runs ``hwnas export`` on a finished run with the QDQ check wrapped (a harness: it replaces
``hwnas.export.verify.verify_qdq`` in this process to see each file's build), so the
files and references are exactly the export's.

    OMP_NUM_THREADS=1 python benchmarks/qdq_divergence.py RUN_DIR --select 1

``--float-layers`` keeps the given layers float in the device files instead of the layers this
machine's timings choose, to rebuild a file whose choice was made on another machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from hwnas.latency.machine import describe_machine

OUT_JSON = Path(__file__).with_suffix(".json")


def layer_codes(data: bytes, build, passes, requantize: bool) -> dict:  # noqa: ANN001
    """The file's code trace (:func:`hwnas.export.code_trace.trace_codes`) and the logit-level
    verdict (:func:`hwnas.export.onnx_export.divergence_of`)."""
    from hwnas.export.code_trace import trace_codes
    from hwnas.export.onnx_export import divergence_of

    ref = build.reference(requantize=requantize)
    with ref as deployed:
        trace = trace_codes(data, deployed, passes.x, points=ref.rounding_points())
    got, expected = trace.logits, trace.reference
    why = divergence_of(got, expected, passes.labels)
    return {"top1_agreement": float(np.mean(got.argmax(1) == expected.argmax(1))),
            "n_images": int(len(got)), "max_abs_diff": float(np.abs(got - expected).max()),
            "first_layer": trace.first_layer,
            "first_layer_distance_to_half": trace.first_distance_to_half,
            "unexplained_layer": trace.unexplained, "starts_as_flips": trace.starts_as_flips,
            "exact_share": why.exact_share, "confident": why.confident,
            "confident_agreement": why.confident_agreement,
            "accuracy_delta": why.accuracy_delta, "rounding": why.rounding, "layers": trace.layers}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--select", default="all", help="as `hwnas export --select`")
    ap.add_argument("--out", type=Path, default=OUT_JSON)
    ap.add_argument("--float-layers", default=None,
                    help="comma-separated layers the device files keep float (default: the "
                         "timed choice); a name that is no quantized layer of a model is ignored")
    args = ap.parse_args(argv)

    import tempfile

    import hwnas.export.verify as me
    from hwnas.export.run_export import export_run

    found: dict[str, dict] = {}
    verify = me.verify_qdq

    def wrapped(proto, build, passes, report, s, *, requantize, require_integer, searched=None):
        found[report.path] = layer_codes(proto.SerializeToString(), build, passes, requantize)
        return verify(proto, build, passes, report, s, requantize=requantize,
                      require_integer=require_integer, searched=searched)

    me.verify_qdq = wrapped
    if args.float_layers is not None:
        import hwnas.export.model_export as mx

        forced, choose = [n for n in args.float_layers.split(",") if n], mx.choose_float_layers

        def chosen(build_model, fp32, quantized, *a, **k):  # noqa: ANN001, ANN202
            policy = choose(build_model, fp32, quantized, *a, **k)
            policy.float_layers = [n for n in quantized if n in forced]
            return policy

        mx.choose_float_layers = chosen
    with tempfile.TemporaryDirectory() as out:
        export_run(args.run_dir, select=args.select, out=out, progress=False)
    for path, r in found.items():
        print(f"\n{path}: top-1 agreement {100 * r['top1_agreement']:.2f}% on {r['n_images']} "
              f"images, max diff {r['max_abs_diff']:.3g}; {100 * r['exact_share']:.1f}% exact; "
              f"first differing code at {r['first_layer']} ({r['first_layer_distance_to_half']} "
              f"levels from a rounding boundary); every difference starts as a flip: "
              f"{r['starts_as_flips']}; logit-level rounding verdict: {r['rounding']}")
        print("| quantizer (codes) | codes differ % | max code diff | images touched % |")
        print("|---|---:|---:|---:|")
        for row in r["layers"]:
            print(f"| {row['layer']} | {row['codes_differ_pct']:.4f} | {row['max_code_diff']} | "
                  f"{row['images_touched_pct']:.2f} |")
    doc = {"command": "python " + " ".join([f"benchmarks/{Path(__file__).name}", *sys.argv[1:]]),
           "machine": describe_machine(
               f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"),
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "results": [{"file": p, **r} for p, r in found.items()]}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
