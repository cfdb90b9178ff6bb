"""Int8 PTQ against float for the subnets on the shipped vit CIFAR-10 supernet's front (issue 44.4).

The shipped supernet of ``--space vit`` is ``cct_cifar10.pt`` once that file is shipped (space
``cct``, the vit family's variant; ``hwnas.supernet.checkpoints.SHIPPED``), ``vit_cifar10.pt``
until then; ``--space cct`` takes the former only.

Each subnet is rebuilt the way ``hwnas run`` scores it and ``hwnas export`` writes it: the
search's splits (``replay_splits``, data seed 0; all 10,000 CIFAR-10 test images), the subnet
extracted (a vit has LayerNorm, nothing to recalibrate), every Linear/Conv layer W8A8
(``uniform(model, 8, 8)``: LayerNorm, softmax, GELU and the residual stream stay float, the
attention products follow their projection's bits), PTQ with the search's ``PTQConfig``
(``ptq_images`` clean training images in batches of 128, seeded). Top-1 on the test images of:

* ``float``: the float subnet in PyTorch;
* ``fq_search``: the fake-quant model the search scores (``TrialEvaluator.quantized_model``);
* ``fq_export``: the fake-quant model of the export (:func:`hwnas.export.qdq.build_qdq` with its
  defaults: the portable int8 grid, i.e. 7-bit weights where a 16-bit pair sum could saturate);
* ``ort_qdq``: that build's exact QDQ file (``qdq/<name>.onnx``) run with onnxruntime;
* ``ort_device``: the requantized file for integer kernels (``qdq-cpu-ort-1t/<name>.onnx`` with
  every layer int8: the per-device float-for-speed choice not applied) with onnxruntime;
* ``ort_device_u8u8``: the same with ``session.x64quantprecision=1`` (no saturation on any CPU);
* ``ov_device``: the same file with OpenVINO (when installed), its default settings (on a CPU
  with AVX-512 BF16 or AMX its float parts, LayerNorm, softmax, GELU, run in bf16);
* ``ov_device_f32``: the same with ``INFERENCE_PRECISION_HINT=f32``;
* ``ov_device_avx2``: the same (f32, what an AVX2 CPU runs) with OpenVINO's oneDNN limited to
  AVX2 (``ONEDNN_MAX_CPU_ISA=AVX2``: uint8 x int8 kernels that add product pairs into a
  saturating int16, what an AVX2 CPU without VNNI runs, whatever this CPU has);
* ``ov_full_avx2``: the file ``build_qdq(..., portable=False)`` writes (full 8-bit weight grid,
  exact only where VNNI/AMX or U8U8 kernels run it), the same way: what the portable grid
  protects against.

Each file's row records its worst 16-bit pair sum (:func:`hwnas.export.qdq.int16.int16_report`).

The subnets default to the front ``benchmarks/cifar10_fronts.json`` (``--fronts``) scored on
the same checkpoint (every cost's front, joined; a json scored on another file, or on another
file of the same name, is refused);
``--subnets smallest,largest,<arch string>`` picks others. Resumable: each (subnet,
variant) row is written to ``--out`` as soon as it is measured and is not measured again (an
``--out`` written on another checkpoint file is refused, by its ``checkpoint_sha256``); the
QDQ files are kept in ``--work``, in a folder per checkpoint digest (a new file under an old
name never reuses the old file's exports). ``--max-seconds`` stops before the next variant once
that much time has passed, so a loop of commands of a few minutes each finishes the table::

    OMP_NUM_THREADS=1 python benchmarks/vit_int8.py [--space vit] [--subnets front]
        [--fronts benchmarks/cifar10_fronts.json] [--variants ...] [--max-seconds 480] [--out benchmarks/vit_int8.json]

Writes ``--out`` (JSON) and the Markdown table beside it (hand-written notes after a
``## Notes`` heading stay).
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

try:  # run as a script, benchmarks/ is on sys.path; loaded by a test, the repo root is
    import cifar10_fronts as fronts_bench
    import quant_peers as peers
    import quant_recipes as recipes
except ModuleNotFoundError:
    from benchmarks import cifar10_fronts as fronts_bench
    from benchmarks import quant_peers as peers
    from benchmarks import quant_recipes as recipes

from hwnas.core.errors import UserError
from hwnas.core.io import file_sha256

HERE = Path(__file__).resolve().parent
VARIANTS = ("float", "fq_search", "fq_export", "ort_qdq", "ort_device", "ort_device_u8u8",
            "ov_device", "ov_device_f32", "ov_device_avx2", "ov_full_avx2")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--space", default="vit", help="vit or cct (a shipped CIFAR-10 checkpoint)")
    p.add_argument("--subnets", default="front",
                   help="front (cifar10_fronts.json's), or a comma list of smallest, largest, "
                        "middle and architecture strings")
    p.add_argument("--fronts", type=Path, default=fronts_bench.OUT_JSON,
                   help="the cifar10_fronts.py json whose front --subnets front takes "
                        "(default the committed one)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--images", type=int, default=0, help="test images (0: all 10,000)")
    p.add_argument("--max-seconds", type=float, default=0,
                   help="stop before the next variant after this long (0: no limit)")
    p.add_argument("--out", default=str(HERE / "vit_int8.json"))
    p.add_argument("--work", default="/tmp/hwnas_vit_int8", help="folder for the QDQ files")
    p.add_argument("--redo", action="store_true", help="measure rows already in --out again")
    return p.parse_args(argv)


def front_archs(checkpoint: str | Path, fronts_json: Path = fronts_bench.OUT_JSON) -> list[str]:
    """The architectures on any of ``cifar10_fronts.json``'s fronts scored on ``checkpoint``
    (its rows are labelled by the ``--space`` that found the file: ``vit`` for the shipped
    ``cct_cifar10.pt``), cheapest (by FLOPs) first. A json scored on another file is refused:
    another name (its architectures are another space's), or the same name with other bytes
    (``checkpoint_sha256``: a supernet shipped since under the same name has another front)."""
    doc = json.loads(fronts_json.read_text())
    name = Path(checkpoint).name
    labels = [k for k, v in doc.get("checkpoints", {}).items() if Path(v).name == name]
    if not labels:
        raise UserError(f"{fronts_json.name} was scored on {sorted(doc.get('checkpoints', {}).values())}, "
                        f"not on {name}; run benchmarks/cifar10_fronts.py again first")
    scored = doc.get("checkpoint_sha256", {}).get(labels[0])
    if scored != file_sha256(checkpoint):
        raise UserError(f"{fronts_json.name} was scored on another {name} (SHA-256 {scored}, "
                        f"not this file's); run benchmarks/cifar10_fronts.py again first")
    archs = {a for per_cost in doc["fronts"].values() for a in per_cost.get(labels[0], [])}
    if not archs:
        raise UserError(f"{fronts_json.name} has no front for {labels[0]!r} ({name})")
    flops = {r["arch"]: r["flops"] for r in doc["results"] if r["space"] == labels[0]}
    return sorted(archs, key=lambda a: flops.get(a, 0))


def pick(space: Any, spec: str, checkpoint: str | Path,
         fronts_json: Path = fronts_bench.OUT_JSON) -> list[tuple[str, Any]]:
    """(role, arch) pairs of ``--subnets`` (``front``: the one scored on ``checkpoint`` in
    ``fronts_json``)."""
    if spec == "front":
        archs = [space.from_string(a) for a in front_archs(checkpoint, fronts_json)]
        smallest, largest = space.to_string(space.smallest()), space.to_string(space.largest())
        return [("smallest" if space.to_string(a) == smallest else
                 "largest" if space.to_string(a) == largest else "front", a) for a in archs]
    roles = recipes.subnet_archs(space)
    out = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        out.append((item, roles[item]) if item in roles else ("given", space.from_string(item)))
    return out


def load(space_name: str, images: int) -> tuple[Any, Any, Any, Any, str]:
    """(space, supernet, the search's splits, its SearchConfig, checkpoint) of the shipped
    CIFAR-10 supernet of ``space_name``, rebuilt as ``hwnas run`` does."""
    from hwnas.search.config import SearchConfig
    from hwnas.supernet.data import load_dataset

    data = load_dataset("cifar10", seed=0)
    cfg = SearchConfig(space=space_name, dataset="cifar10", data_seed=0, seed=0,
                       eval_images=images, devices=[])
    cfg.validate()
    space, supernet, splits, checkpoint = fronts_bench.load_space(space_name, data, cfg)
    return space, supernet, splits, cfg, checkpoint


def test_arrays(splits: Any) -> tuple[np.ndarray, np.ndarray]:
    """The test split normalised as the search scores it, as float32 NCHW and labels."""
    from hwnas.supernet.evaluate import eval_loader

    xs, ys = zip(*((x.numpy(), y.numpy()) for x, y in eval_loader(splits, splits.test)))
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys)


def export_build(model: torch.nn.Module, splits: Any, cfg: Any, example: torch.Tensor,
                 portable: bool = True) -> Any:
    """The export's :func:`build_qdq` of ``model`` at W8A8, as ``hwnas export`` makes it for a
    trial of this run (``run_export._prepare``'s calibration batches and PTQConfig)."""
    from hwnas.export.qdq import build_qdq
    from hwnas.quant.policy import uniform
    from hwnas.quant.ptq import PTQConfig, calibration_batches
    from hwnas.supernet.data.loader import BatchLoader

    config = PTQConfig(max_images=cfg.ptq_images, seed=cfg.seed)
    batches = calibration_batches(
        BatchLoader(splits.train, batch_size=128, mean=splits.mean, std=splits.std, shuffle=True,
                    seed=cfg.seed), config.max_images, "cpu")
    return build_qdq(copy.deepcopy(model), uniform(model, 8, 8), batches, config=config,
                     example=example, portable=portable)


def torch_top1(model: torch.nn.Module, splits: Any) -> float:
    from hwnas.supernet.evaluate import accuracy, eval_loader

    return float(accuracy(model.eval(), eval_loader(splits, splits.test)))


def subnet_rows(role: str, arch: Any, space: Any, supernet: Any, splits: Any, cfg: Any,
                variants: list[str], done: set[tuple[str, str]], args: argparse.Namespace,
                save: Any, start: float) -> bool:
    """Measure ``variants`` of one subnet not yet in ``done``; ``save(row)`` each. False when
    ``--max-seconds`` ran out first."""
    from hwnas.export.qdq.int16 import int16_report
    from hwnas.quant.policy import uniform
    from hwnas.search.evaluator import TrialEvaluator
    from hwnas.search.replay import eval_settings

    key = space.to_string(arch)
    todo = [v for v in variants if (key, v) not in done]
    if not todo:
        return True
    evaluator = TrialEvaluator(space, supernet, splits, [], eval_settings(cfg))
    torch.manual_seed(cfg.seed)
    model = evaluator.float_model(arch).eval()
    work = Path(args.work) / args.checkpoint_sha256[:16] / key
    work.mkdir(parents=True, exist_ok=True)
    files = {"ort_qdq": work / "qdq.onnx", "ort_device": work / "qdq_device.onnx"}
    files["ort_device_u8u8"] = files["ov_device"] = files["ov_device_f32"] = files["ort_device"]
    files["ov_device_avx2"] = files["ort_device"]
    files["ov_full_avx2"] = work / "qdq_device_full.onnx"
    build = None
    test_x = test_y = None
    from hwnas.search.evaluator import COST_METRICS

    layers = space.layers(arch)
    flops = int(COST_METRICS["flops"](layers, layers, None))
    for variant in todo:
        if args.max_seconds and time.perf_counter() - start > args.max_seconds:
            return False
        t0 = time.perf_counter()
        extra: dict[str, Any] = {}
        if variant == "float":
            top1 = torch_top1(model, splits)
        elif variant == "fq_search":
            top1 = torch_top1(evaluator.quantized_model(copy.deepcopy(model),
                                                        uniform(model, 8, 8)), splits)
        else:
            if variant == "ov_full_avx2" and not files[variant].is_file():
                full = export_build(model, splits, cfg, splits.test.images[:1].float(),
                                    portable=False)
                onnx.save(full.proto(requantize=True), files[variant])
                extra["build_seconds"] = round(time.perf_counter() - t0, 1)
            need_build = variant == "fq_export" or not files[variant].is_file()
            if need_build and build is None:
                build = export_build(model, splits, cfg, splits.test.images[:1].float())
                onnx.save(build.proto(requantize=False), files["ort_qdq"])
                onnx.save(build.proto(requantize=True), files["ort_device"])
                extra["build_seconds"] = round(time.perf_counter() - t0, 1)
                extra["narrowed"] = dict(build.narrowed)
            if variant == "fq_export":
                top1 = torch_top1(build.qmodel, splits)
            else:
                if test_x is None:
                    test_x, test_y = test_arrays(splits)
                if variant.startswith("ov_"):
                    if not peers._has_openvino():
                        print(f"  {key}: {variant} skipped: OpenVINO is not installed",
                              flush=True)
                        continue
                    got = peers.ov_top1([files[variant]], test_x, work,
                                        "AVX2" if variant.endswith("avx2") else "",
                                        "" if variant == "ov_device" else "f32")
                    if files[variant].name not in got:
                        print(f"  {key}: OpenVINO cannot compile the file", flush=True)
                        continue
                    pred = got[files[variant].name]
                else:
                    pred = peers.ort_top1(files[variant], test_x,
                                          u8u8=variant.endswith("u8u8"))
                top1 = 100 * float((pred == test_y).mean())
                report = int16_report(onnx.load(str(files[variant])))
                extra.update(int16_safe=report["int16_safe"],
                             worst_pair_sum=report["worst_pair_sum"])
        row = {"space": space.name, "role": role, "arch": key, "flops": flops,
               "variant": variant, "top1": round(top1, 2), "test_images": len(splits.test),
               "seconds": round(time.perf_counter() - t0, 1), **extra}
        save(row)
        print(f"  {key} {variant:16s} {row['top1']:6.2f} %  [{row['seconds']:.0f} s]", flush=True)
    return True


def markdown(doc: dict[str, Any]) -> str:
    """The table: one line per subnet, one column per variant (drops against float)."""
    rows = doc["results"]
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in rows)]
    archs = sorted({r["arch"]: r["flops"] for r in rows}.items(), key=lambda kv: kv[1])
    lines = [f"# Int8 PTQ of the {doc['space']} CIFAR-10 front ({doc['date']})", "",
             "```", *doc["commands"], "```", "", f"Machine: {doc['machine']}; ISA: "
             f"{' '.join(doc['isa']['isa'])}", "",
             f"{doc['test_images']} CIFAR-10 test images; W8A8 PTQ as the search scores it and "
             f"the export writes it (top-1 %, in brackets the change against float).", "",
             "| subnet | MFLOPs | " + " | ".join(variants) + " |",
             "|---|---:|" + "---:|" * len(variants)]
    for arch, flops in archs:
        mine = {r["variant"]: r for r in rows if r["arch"] == arch}
        base = mine.get("float", {}).get("top1")
        cells = []
        for v in variants:
            if v not in mine:
                cells.append("")
                continue
            t = mine[v]["top1"]
            cells.append(f"{t:.2f}" if v == "float" or base is None else f"{t:.2f} ({t - base:+.2f})")
        role = next(iter(mine.values()))["role"]
        lines.append(f"| `{arch}` ({role}) | {flops / 1e6:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from hwnas.latency.machine import describe_machine
    from hwnas.latency.ondevice import cpu_isa

    torch.set_num_threads(1)
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise UserError(f"unknown variant {unknown[0]!r}; expected one of {', '.join(VARIANTS)}")
    if args.images < 0:
        raise UserError(f"--images {args.images}: expected 0 (every test image) or more")
    start = time.perf_counter()
    space, supernet, splits, cfg, checkpoint = load(args.space, args.images)
    picks = pick(space, args.subnets, checkpoint, args.fronts)
    out = Path(args.out)
    sha = args.checkpoint_sha256 = file_sha256(checkpoint)
    old = json.loads(out.read_text()) if out.is_file() else {}
    if old and (old.get("space") != space.name or old.get("test_images") != len(splits.test)
                or old.get("checkpoint_sha256") != sha):
        raise UserError(f"{out} holds rows of another space, test set or checkpoint file; give "
                        f"another --out")
    rows: list[dict[str, Any]] = old.get("results", [])
    if args.redo:
        redo = {(space.to_string(a), v) for _, a in picks for v in variants}
        rows = [r for r in rows if (r["arch"], r["variant"]) not in redo]
    commands = old.get("commands", [])
    command = "OMP_NUM_THREADS=1 " + recipes.command_line(argv)
    if command not in commands:
        commands.append(command)
    import onnxruntime as ort

    versions = f"torch {torch.__version__}, onnx {onnx.__version__}, onnxruntime {ort.__version__}"
    if peers._has_openvino():
        import openvino

        versions += f", openvino {openvino.__version__}"
    doc = {"command": " && ".join(commands), "commands": commands,
           "space": space.name, "checkpoint": str(Path(checkpoint).name),
           "checkpoint_sha256": sha,
           "machine": describe_machine(f"1 torch thread, 1 onnxruntime thread, {versions}, "
                                       f"Python {platform.python_version()}"),
           "isa": cpu_isa(), "date": recipes.now_iso(), "test_images": len(splits.test),
           "ptq_images": cfg.ptq_images, "results": rows}

    def write() -> None:
        recipes.write_json(out, doc)
        md = out.with_suffix(".md")
        notes = md.read_text().partition("\n## Notes")[1:] if md.is_file() else ("", "")
        md.write_text(markdown(doc) + "".join(notes))  # the hand-written notes stay

    def save(row: dict[str, Any]) -> None:
        rows[:] = [r for r in rows if (r["arch"], r["variant"]) != (row["arch"], row["variant"])]
        rows.append(row)
        write()

    done = {(r["arch"], r["variant"]) for r in rows}
    finished = True
    for role, arch in picks:
        print(f"{role} {space.to_string(arch)}:", flush=True)
        if not subnet_rows(role, arch, space, supernet, splits, cfg, variants, done, args, save,
                           start):
            finished = False
            break
    if rows:
        write()  # this command's record (machine, ISA) even when every row was there
    print(markdown(doc))
    print(("done" if finished else f"stopped after --max-seconds {args.max_seconds:.0f}; run the "
           f"same command again to go on") + f"; wrote {out}")
    return 0 if finished else 3


if __name__ == "__main__":
    recipes.run_script(main, "vit_int8")
