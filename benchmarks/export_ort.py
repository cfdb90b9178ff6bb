"""int8 (QDQ) vs FP32 onnxruntime latency of exported mbv3 CIFAR-10 subnets, per CPU.

For the largest, middle and smallest subnet of the shipped CIFAR-10 supernet
(``supernet/checkpoints/mbv3_cifar10.pt``), at each batch size and thread count it times, with
onnxruntime on this CPU:

* ``fp32``        - the FP32 export (BatchNorm folded);
* ``uniform``     - every conv/linear layer int8 (uint8 activations, int8 per-channel weights),
                    QDQ as :mod:`hwnas.export.qdq` writes it (requantized so every layer is an
                    integer kernel);
* ``best``        - the best per-layer policy for *this* CPU, batch and thread count: the layers
                    where int8 loses stay float (:func:`hwnas.export.device_policy.choose_float_layers`).

``int8_ms`` / ``speedup`` in each row are those of ``best`` (``uniform_*`` beside them), and
``int8_recommended`` says whether hwnas would deploy it (only when it measured faster than
FP32). Calibration and the agreement check use CIFAR-10 test/train images when the shared data
is found (``--data``), else random images (agreement is then not reported).

Needs only torch, onnx, onnxruntime and numpy (no optuna, no tqdm), so it runs on a GPU
machine's host CPU as well; ``--merge`` adds this machine's rows to an existing JSON (rows with
the same model, CPU, batch and threads are replaced)::

    python benchmarks/export_ort.py                                   # here: threads 1,2
    python benchmarks/export_ort.py --threads 1,2,8 --merge           # e.g. on the GPU host
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent

import torch  # noqa: E402
from hwnas.export.device_policy import choose_float_layers  # noqa: E402
from hwnas.export.onnx_export import check_parity  # noqa: E402
from hwnas.export.ort_profile import LayerIndex, integer_kernel_check  # noqa: E402
from hwnas.export.qdq import build_qdq, float_proto, map_layer_nodes  # noqa: E402
from hwnas.latency.devices import MeasuredDevice  # noqa: E402
from hwnas.latency.machine import cpu_flags, cpu_model  # noqa: E402

try:  # run as a script, benchmarks/ is on sys.path; loaded by a test, the repo root is
    import quant_recipes as recipes
except ModuleNotFoundError:
    from benchmarks import quant_recipes as recipes
subnet_archs = recipes.subnet_archs
command_line = recipes.command_line
run_script = recipes.run_script
from hwnas.quant.policy import uniform  # noqa: E402
from hwnas.quant.ptq import PTQConfig  # noqa: E402
from hwnas.supernet.checkpoints import CIFAR10_CLASSES, shipped_checkpoint  # noqa: E402
from hwnas.supernet.evaluate import recalibrated_subnet  # noqa: E402
from hwnas.supernet.train import load_checkpoint, with_training_augment  # noqa: E402

from hwnas.core.errors import UserError  # noqa: E402
from hwnas.core.io import write_atomic  # noqa: E402

ROLES = ("largest", "middle", "smallest")


def integer_dot_product() -> tuple[bool, list[str]]:
    """Whether this CPU has VNNI/AMX-class (x86) or dot-product (Arm) integer instructions."""
    wanted = {"avx512_vnni", "avx_vnni", "amx_int8", "amx_tile", "avx512_bf16", "asimddp", "i8mm"}
    flags = cpu_flags()
    found = sorted(flags & wanted)
    return any(f in flags for f in ("avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm")), found


def images(data_spec: str | None, n_calib: int, n_test: int, seed: int):  # noqa: ANN201
    """(calibration batches, (test images, labels) or None, source description, the dataset or
    None)."""
    if data_spec:
        try:
            from hwnas.supernet.data import BatchLoader, load_dataset

            data = load_dataset(data_spec, seed=seed)
            calib = BatchLoader(data.train, batch_size=128, mean=data.mean, std=data.std,
                                shuffle=True, seed=seed)
            xs = []
            for x, _ in calib:
                xs.append(x)
                if sum(len(t) for t in xs) >= n_calib:
                    break
            # a seeded random sample: CIFAR-10's test split is sorted by class
            test = next(iter(BatchLoader(data.test, batch_size=n_test, mean=data.mean,
                                         std=data.std, shuffle=True, seed=seed)))
            source = f"{data.name} ({n_calib} calibration images, {len(test[0])} test images)"
            return [torch.cat(xs)[:n_calib]], test, source, data
        except (UserError, ImportError, OSError) as exc:
            print(f"# no real images ({exc}); calibrating on random images", file=sys.stderr)
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n_calib, 3, 32, 32, generator=g)], None, "random normal images", None


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Top-1 accuracy (%) of a PyTorch model."""
    with torch.no_grad():
        return 100.0 * float((model(x).argmax(1) == y).float().mean())


def verify(chosen, searched, x: torch.Tensor, y: torch.Tensor) -> dict:  # noqa: ANN001
    """Agreement of the chosen QDQ model (run by onnxruntime) with the PyTorch model it
    implements (fake-quant + int32 biases + requantization) and with the searched fake-quant
    model (all layers int8), and the test accuracies."""
    import onnxruntime as ort

    data = chosen.proto().SerializeToString()
    with chosen.reference(requantize=True) as deployed:
        exact = check_parity(data, deployed, x, atol=float("inf"))
    plain = check_parity(data, searched.qmodel, x, atol=float("inf"))
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    logits = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    return {"top1_agreement": exact.top1_agreement, "max_abs_diff": exact.max_abs_diff,
            "top1_agreement_searched": plain.top1_agreement,
            "fake_quant_test_accuracy": accuracy(searched.qmodel, x, y),
            "int8_test_accuracy": 100.0 * float((logits.argmax(1) == y.numpy()).mean())}


# -- what the export benchmarks (export_ort, export_ort_ops, export_runtimes) share --------------

def int_list(name: str, values: list[int]) -> list[int]:
    """``values`` without repeats (first occurrence kept); UserError unless all are positive."""
    if not values or min(values) < 1:
        raise UserError(f"{name} must be positive integers, got {values}")
    return list(dict.fromkeys(values))


def parse_list(name: str, text: str) -> list[int]:
    """A comma-separated list of positive integers (``--batches 1,32``), as :func:`int_list`."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{name}: expected a comma-separated list of positive integers, got "
                        f"{text!r}") from None
    return int_list(name, values)


def check_models(roles: list[str]) -> list[str]:
    """The subnets asked for (``--models``), each one of :data:`ROLES`."""
    if not roles or any(r not in ROLES for r in roles):
        raise UserError(f"--models: expected some of {' '.join(ROLES)}, got {roles}")
    return roles


def load_mbv3(checkpoint: str | None):  # noqa: ANN201 - (path, space, supernet, payload)
    """The mbv3 CIFAR-10 supernet of ``--checkpoint`` (default: the shipped one)."""
    ckpt = checkpoint or shipped_checkpoint("mbv3", CIFAR10_CLASSES)
    if ckpt is None:
        raise UserError("the shipped checkpoint supernet/checkpoints/mbv3_cifar10.pt is "
                        "missing; pass --checkpoint")
    space, supernet, payload = load_checkpoint(ckpt)
    if space.name != "mbv3":
        raise UserError(f"--checkpoint holds space {space.name!r}; expected an mbv3 supernet")
    return ckpt, space, supernet, payload


def merge(out: Path, doc: dict, merge_rows: bool) -> dict:
    """``doc`` merged into the JSON at ``out``: rows keyed by (model, cpu, batch, threads)."""
    if not (merge_rows and out.is_file()):
        doc["runs"] = [{k: doc[k] for k in ("command", "machine", "date")}]
        return doc
    old = json.loads(out.read_text())
    key = lambda r: (r["model"], r["cpu"], r["batch"], r["threads"])  # noqa: E731
    new_keys = {key(r) for r in doc["results"]}
    rows = [r for r in old.get("results", []) if key(r) not in new_keys] + doc["results"]
    runs = old.get("runs") or [{k: old.get(k) for k in ("command", "machine", "date")}]
    doc["runs"] = runs + [{k: doc[k] for k in ("command", "machine", "date")}]
    doc["results"] = sorted(rows, key=lambda r: (r["cpu"], ROLES.index(r["model"])
                                                 if r["model"] in ROLES else 9, r["batch"],
                                                 r["threads"]))
    return doc


def markdown(doc: dict) -> str:
    lines = ["# int8 (QDQ) vs FP32 with onnxruntime: mbv3 CIFAR-10 subnets", "",
             "Written by `benchmarks/export_ort.py`; latencies are medians (ms per batch), timed "
             "round-robin against FP32. `best` keeps in float the layers where int8 loses on that "
             "CPU/batch/threads; `int8?` is whether hwnas recommends the quantized model there "
             "(only when it was faster than FP32 in both of its timings, the candidates' and the "
             "final one, so a noisy row can say `no` beside a speed-up). "
             "Agreement: top-1 agreement of the `best` ONNX model (onnxruntime) with the PyTorch "
             "model it implements (fake-quant + int32 biases + requantization) / with the searched "
             "fake-quant model (all layers int8, float biases, no requantization). Accuracy: "
             "top-1 % on the test images of FP32 / the searched fake-quant model / the `best` "
             "ONNX model. FP32 and the int8 variants of a row are timed round-robin, so load from "
             "other processes hits them alike; across rows and runs on a shared machine the "
             "absolute times move with that load (2-thread rows on a 2-CPU machine most).", ""]
    for run in doc.get("runs", []):
        note = f" ({run['note']})" if run.get("note") else ""
        lines.append(f"- {run.get('date')}: `{run.get('command')}` on {run.get('machine')}{note}")
    lines.append("")
    cpus = list(dict.fromkeys(r["cpu"] for r in doc["results"]))
    for cpu in cpus:
        rows = [r for r in doc["results"] if r["cpu"] == cpu]
        vnni = rows[0].get("integer_dot_product")
        lines += [f"## {cpu} (integer dot product: {'yes' if vnni else 'no'})", "",
                  "| model | batch | threads | fp32 ms | uniform int8 ms (x) | best int8 ms (x) | "
                  "float layers | int8? | agreement % | accuracy % |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            agree = acc = ""
            if r.get("top1_agreement") is not None:
                mark = "" if r.get("test_sample") == "random" else " †"
                agree = (f"{100 * r['top1_agreement']:.1f} / "
                         f"{100 * r['top1_agreement_searched']:.1f}{mark}")
                acc = (f"{r['fp32_test_accuracy']:.1f} / {r['fake_quant_test_accuracy']:.1f} / "
                       f"{r['int8_test_accuracy']:.1f}{mark}")
            lines.append(
                f"| {r['model']} | {r['batch']} | {r['threads']} | {r['fp32_ms']:.2f} | "
                f"{r['uniform_int8_ms']:.2f} ({r['uniform_speedup']:.2f}x) | {r['int8_ms']:.2f} "
                f"({r['speedup']:.2f}x) | {r['float_layers']}/{r['quantized_layers']} | "
                f"{'yes' if r['int8_recommended'] else 'no'} | {agree} | {acc} |")
        lines.append("")
    if any(r.get("top1_agreement") is not None and r.get("test_sample") != "random"
           for r in doc["results"]):
        lines += ["† agreement and accuracy on the first test images of the split, which for "
                  "CIFAR-10 (sorted by class) are all airplanes: not representative of the "
                  "whole test set (now a seeded random sample is used). The latency columns are "
                  "unaffected.", ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(ROLES), help="subnets: largest,middle,smallest")
    p.add_argument("--batches", default="1,32", help="batch sizes (default 1,32)")
    p.add_argument("--threads", default="1,2", help="onnxruntime thread counts (default 1,2)")
    p.add_argument("--data", default="cifar10",
                   help="dataset for calibration and agreement ('' = random images)")
    p.add_argument("--calib-images", type=int, default=256)
    p.add_argument("--test-images", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (default 5)")
    p.add_argument("--refine", type=int, default=0, help="greedy refinement steps per config")
    p.add_argument("--checkpoint", help="mbv3 CIFAR-10 supernet checkpoint (default: the shipped "
                                        "supernet/checkpoints/mbv3_cifar10.pt)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(HERE / "export_ort.json"))
    p.add_argument("--merge", action="store_true",
                   help="keep the rows of other CPUs/configs already in --out")
    p.add_argument("--markdown-only", action="store_true",
                   help="only rewrite the .md report from the JSON at --out")
    args = p.parse_args(argv)
    if args.markdown_only:
        out = Path(args.out)
        write_atomic(out.with_suffix(".md"), markdown(json.loads(out.read_text())))
        return 0
    roles = check_models([r for r in args.models.split(",") if r])
    batches = parse_list("--batches", args.batches)
    threads = parse_list("--threads", args.threads)
    torch.set_num_threads(max(threads))
    command = command_line(argv)
    vnni, flags = integer_dot_product()
    cpu = cpu_model()
    import onnxruntime as ort

    machine = (f"{cpu}, {os.cpu_count()} logical CPUs, onnxruntime {ort.__version__}, integer "
               f"dot product: {'yes' if vnni else 'no'} ({' '.join(flags) or 'none'})")
    print(f"# {machine}", flush=True)

    ckpt, space, supernet, payload = load_mbv3(args.checkpoint)
    calib, test, source, data = images(args.data or None, args.calib_images, args.test_images,
                                       args.seed)
    config = PTQConfig(max_images=args.calib_images, seed=args.seed)
    rows = []
    start = time.perf_counter()
    for role in roles:
        arch = subnet_archs(space)[role]
        fp32_acc = None
        if data is not None:
            # BatchNorm recalibrated as the search does it: 20 batches of 64 training images
            # with the checkpoint's training augmentation
            model = recalibrated_subnet(
                supernet, arch, with_training_augment(data, payload.get("train_config"))).eval()
            fp32_acc = accuracy(model, *test)
        else:
            model = supernet.extract(arch).eval()
        example = calib[0][:1]
        build = build_qdq(model, uniform(model, 8, 8), calib, config=config, example=example)
        fp32 = float_proto(model, example)
        fp32_index = LayerIndex.from_source(fp32, map_layer_nodes(fp32, build.builder.node_of))
        uniform_proto = build.proto()
        qdq_index = LayerIndex.from_source(uniform_proto, build.builder.node_of)
        quantized = build.integer_layers()
        _, islands = integer_kernel_check(uniform_proto.SerializeToString(), qdq_index, quantized)
        checks: dict[tuple[str, ...], dict] = {}
        for batch in batches:
            for t in threads:
                choice = choose_float_layers(
                    lambda fl: build.proto(extra_float=fl).SerializeToString(),
                    fp32.SerializeToString(), quantized, build.kinds, fp32_index=fp32_index,
                    qdq_index=qdq_index, device=MeasuredDevice(f"{cpu}/t{t}", threads=t, batch=batch),
                    rounds=args.rounds, refine=args.refine)
                key = tuple(choice.float_layers)
                if test is not None and key not in checks:
                    chosen = build if not key else build_qdq(
                        model, uniform(model, 8, 8), calib, config=config, example=example,
                        float_layers=list(key))
                    checks[key] = verify(chosen, build, *test)
                row = {
                    "model": role, "arch": space.to_string(arch), "cpu": cpu,
                    "integer_dot_product": vnni, "batch": batch, "threads": t,
                    "fp32_ms": choice.fp32_ms, "int8_ms": choice.chosen_ms,
                    "speedup": choice.speedup, "int8_recommended": choice.quantized_faster,
                    "uniform_int8_ms": choice.uniform_ms,
                    "uniform_speedup": choice.fp32_ms / choice.uniform_ms,
                    "best_label": choice.chosen_label, "float_layers": len(choice.float_layers),
                    "float_layer_names": choice.float_layers,
                    "float_layer_kinds": {k: sum(1 for n in choice.float_layers
                                                 if build.kinds.get(n) == k)
                                          for k in sorted(set(build.kinds.values()))},
                    "quantized_layers": len(quantized), "uniform_float_islands": len(islands),
                    **checks.get(key, {}), "fp32_test_accuracy": fp32_acc,
                    "test_sample": "random",
                    "candidates": {c.label: round(c.median_ms, 4) for c in choice.candidates},
                    "fp32_p95_ms": choice.fp32_p95_ms, "int8_p95_ms": choice.chosen_p95_ms,
                }
                rows.append(row)
                print(f"{role:8s} batch {batch:3d} threads {t}: fp32 {choice.fp32_ms:8.2f} ms | "
                      f"uniform int8 {choice.uniform_ms:8.2f} ({row['uniform_speedup']:.2f}x) | "
                      f"best {choice.chosen_ms:8.2f} ({choice.speedup:.2f}x, "
                      f"{len(choice.float_layers)} float, {choice.chosen_label}) | "
                      f"recommend int8: {'yes' if choice.quantized_faster else 'no'}", flush=True)
    doc = {"command": command, "machine": machine, "checkpoint": str(ckpt),
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "calibration": source, "seconds": round(time.perf_counter() - start, 1),
           "results": rows}
    out = Path(args.out)
    doc = merge(out, doc, args.merge)
    write_atomic(out, json.dumps(doc, indent=1) + "\n")
    write_atomic(out.with_suffix(".md"), markdown(doc))
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    run_script(main, "export_ort")
