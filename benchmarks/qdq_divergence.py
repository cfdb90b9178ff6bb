"""Where a QDQ file's logits leave its fake-quant reference: layer by layer, the integer codes
each activation quantizer produces in onnxruntime (the graph's QuantizeLinear outputs) against
the codes the reference (``QdqBuild.reference``: int32 biases, requantization points) produces
on the same test images, plus :func:`hwnas.export.onnx_export.divergence_of`'s verdict.

Runs ``hwnas export`` on a finished run with the QDQ check wrapped (a harness: it replaces
``hwnas.export.verify.verify_qdq`` in this process to see each file's build), so the
files and references are exactly the export's.

    OMP_NUM_THREADS=1 python benchmarks/qdq_divergence.py RUN_DIR --select 1
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
    """Per quantized input: share of differing codes, largest difference, images touched."""
    import onnx
    import onnxruntime as ort
    import torch

    from hwnas.export.onnx_export import divergence_of

    proto = onnx.load_from_string(data)
    qnodes = [n for n in proto.graph.node if n.op_type == "QuantizeLinear"
              and n.name.startswith("/") and n.name.endswith("/input_q")]
    names = [n.name[1:-len("/input_q")] for n in qnodes]
    for n in qnodes:
        proto.graph.output.append(onnx.helper.make_tensor_value_info(
            n.output[0], onnx.TensorProto.UINT8, None))  # activations: [0, 2^b - 1]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(proto.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    x = passes.x.cpu()
    outs = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
    got, ort_codes = outs[0], dict(zip(names, outs[1:]))
    pt_codes: dict[str, np.ndarray] = {}
    pt_values: dict[str, np.ndarray] = {}
    with build.reference(requantize=requantize) as deployed:
        modules = dict(deployed.named_modules())

        def hook(name):
            def pre(module, inputs):
                q = module.input_quant
                s = q.scale.detach().clamp_min(1e-8).reshape(())
                v = inputs[0].float() * torch.ones(()).div(s)  # before rounding
                pt_values[name] = v.numpy()
                c = v.round().add(q.zero_point.reshape(()))
                pt_codes[name] = c.clamp(q.qmin, q.qmax).numpy().astype(np.int64)
            return pre

        handles = [modules[n].register_forward_pre_hook(hook(n)) for n in names
                   if hasattr(modules.get(n), "input_quant")]
        try:
            with torch.no_grad():
                ref = deployed(x).numpy()
        finally:
            for h in handles:
                h.remove()
    agree = got.argmax(1) == ref.argmax(1)
    why = divergence_of(got, ref, passes.labels)
    layers, first, first_tie = [], None, None
    for n in names:
        if n not in pt_codes:
            continue
        a, b = ort_codes[n].astype(np.int64), pt_codes[n]
        dif = a != b
        touched = dif.reshape(len(a), -1).any(1)
        if dif.any() and first is None:
            first = n
            # how far from a rounding boundary (x/s = k + 0.5) the first differing values were
            frac = np.abs(pt_values[n][dif] - np.floor(pt_values[n][dif]) - 0.5)
            first_tie = {"values": int(dif.sum()), "max_distance_to_half": float(frac.max())}
        layers.append({"layer": n, "codes_differ_pct": float(100 * dif.mean()),
                       "max_code_diff": int(np.abs(a - b).max()),
                       "images_touched_pct": float(100 * touched.mean()),
                       "disagreeing_images_touched_pct": float(100 * touched[~agree].mean())
                       if (~agree).any() else 0.0})
    return {"top1_agreement": float(agree.mean()), "n_images": int(len(x)),
            "max_abs_diff": float(np.abs(got - ref).max()), "first_layer": first,
            "first_layer_rounding": first_tie,
            "exact_share": why.exact_share, "confident": why.confident,
            "confident_agreement": why.confident_agreement,
            "accuracy_delta": why.accuracy_delta, "rounding": why.rounding, "layers": layers}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--select", default="all", help="as `hwnas export --select`")
    ap.add_argument("--out", type=Path, default=OUT_JSON)
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
    with tempfile.TemporaryDirectory() as out:
        export_run(args.run_dir, select=args.select, out=out, progress=False)
    for path, r in found.items():
        print(f"\n{path}: top-1 agreement {100 * r['top1_agreement']:.2f}% on {r['n_images']} "
              f"images, max diff {r['max_abs_diff']:.3g}; {100 * r['exact_share']:.1f}% exact; "
              f"first differing code at {r['first_layer']} ({r['first_layer_rounding']}); "
              f"rounding flips: {r['rounding']}")
        print("| layer (input codes) | codes differ % | max code diff | images touched % | "
              "disagreeing images touched % |")
        print("|---|---:|---:|---:|---:|")
        for row in r["layers"]:
            print(f"| {row['layer']} | {row['codes_differ_pct']:.4f} | {row['max_code_diff']} | "
                  f"{row['images_touched_pct']:.2f} | {row['disagreeing_images_touched_pct']:.1f} |")
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
