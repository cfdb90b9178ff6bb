"""Every runtime and precision of exported mbv3 CIFAR-10 subnets on this CPU, and the file the
recommendation rule picks.

For the largest, middle and smallest subnet of the shipped CIFAR-10 supernet
(``supernet/checkpoints/mbv3_cifar10.pt``, BatchNorm recalibrated as the search does it) it
exports FP32 (BatchNorm folded) and int8 QDQ files (every conv/linear layer, as
:func:`hwnas.export.qdq.build_qdq` writes it: exact, and requantized for onnxruntime's integer
kernels) and, at each batch size and thread
count, runs them as candidates of :mod:`hwnas.export.recommend`: onnxruntime FP32 and int8;
OpenVINO FP32 and int8, and each file under the bf16/f16 precision hints the CPU plugin runs;
at two threads or more and a batch of two or more also OpenVINO's f32/bf16 candidates split over
2 and 4 streams (``ov bf16 x2``: the batch as two sub-batches on parallel infer requests, the
threads shared between them; :func:`hwnas.export.recommend.stream_counts`).
Every candidate is verified on the test images (top-1 agreement >= 99 % with the PyTorch model
it implements; accuracy within 0.3 point of the FP32 PyTorch model) and all are timed in ONE
paired, interleaved measurement, so the speed-ups against onnxruntime FP32 are fair on a shared
machine. ``recommended`` is the rule's pick: the fastest verified candidate, only if it beat
onnxruntime FP32 overall and in both halves of the measurement (FP32 otherwise).

The JSON is written after every model, so a cut-off run keeps what it measured. ``--merge``
keeps rows of other CPUs/configs already in ``--out``::

    python benchmarks/export_runtimes.py --threads 1 --batches 1 32 --test-images 2000 --rounds 3
    python benchmarks/export_runtimes.py --threads 1 8 --merge        # e.g. on the GPU host

``--accuracy-only`` verifies every candidate of every model (the same files, references and
verification, no timing) and writes the accuracy table to ``--accuracy-out``: accuracy depends on
the runtime, the precision and the CPU's instruction set, not on threads or batch, so it runs
once on all test images while the timing runs use a sample. Both JSONs feed the one .md::

    python benchmarks/export_runtimes.py --accuracy-only --threads 2   # all 10,000 test images

``--repick`` re-applies the current tie rule to the stored rows (no measuring) when the rule
changes; rows keep their per-round medians and file sizes for it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

import numpy as np
import torch
from hwnas.export.qdq import build_qdq, float_proto
from hwnas.export.recommend import (
    NOT_FASTER_NOTE,
    TIE_PHRASE,
    CandidateFile,
    choose_fastest,
    tie_note,
    tie_order,
    time_candidates,
    verify_candidates,
)
from hwnas.latency.machine import cpu_model
from hwnas.latency.onnx_measure import (
    MAX_MARGIN,
    RUNTIMES,
    clearly_faster,
    openvino_available,
    round_medians,
)
from hwnas.quant.policy import uniform
from hwnas.quant.ptq import PTQConfig

from hwnas.core.errors import UserError
from hwnas.core.io import write_atomic

try:  # run as a script, benchmarks/ is on sys.path; loaded by a test, the repo root is
    import export_ort
except ModuleNotFoundError:
    from benchmarks import export_ort

ROLES = export_ort.ROLES
int_list = export_ort.int_list
SHORT = {"onnxruntime": "ort", "openvino": "ov"}


def precision_name(row: dict) -> str:
    """``PRECISION[ xS]`` of a result row: ``bf16 x2`` runs over 2 OpenVINO streams."""
    streams = row.get("streams", 1)
    return row["precision"] + (f" x{streams}" if streams > 1 else "")


def candidate_name(row: dict, runtime: str | None = None) -> str:
    """``RUNTIME PRECISION[ xS]`` of a result row (``ov bf16 x2``); ``runtime`` names it."""
    return f"{runtime or SHORT[row['runtime']]} {precision_name(row)}"


def logits(model: torch.nn.Module, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return torch.cat([model(x[i:i + 256]) for i in range(0, len(x), 256)]).numpy()


def export_files(role: str, model: torch.nn.Module, calib: list[torch.Tensor],
                 test_x: torch.Tensor, config: PTQConfig) -> tuple[list[CandidateFile], dict]:
    """The files of ``model`` - FP32; int8 QDQ as the export writes the searched policy
    (``qdq/``, exact: Q/DQ where the fake-quant model has them); the same requantized so every
    layer is an onnxruntime integer kernel (``qdq-requant/``, as the per-device files) - and the
    logits on ``test_x`` of the PyTorch models they implement. Every file must stay within
    0.3 point of the float model."""
    example = calib[0][:1]
    build = build_qdq(model, uniform(model, 8, 8), calib, config=config, example=example)
    files = [CandidateFile(f"{role}.onnx", float_proto(model, example).SerializeToString(),
                           "fp32", "float")]
    refs = {"float": logits(model, test_x)}
    for requantize, kind, folder in ((False, "int8", "qdq"), (True, "int8-requant", "qdq-requant")):
        path = f"{folder}/{role}.onnx"
        files.append(CandidateFile(path, build.proto(requantize=requantize).SerializeToString(),
                                   kind, path, baseline="float"))
        with build.reference(requantize=requantize) as deployed:
            refs[path] = logits(deployed, test_x)
    return files, refs


def measure(files: list[CandidateFile], refs: dict, test_x: np.ndarray,
            test_y: np.ndarray | None, *, runtimes: list[str], batch: int, threads: int,
            rounds: int, runs: int, warmup: int, cache: dict, seed: int = 0) -> list[dict]:
    """One row per candidate (runtime x file x precision) at ``batch`` and ``threads``: its
    verification and its time in one paired measurement of all candidates of all runtimes."""
    candidates, runners, notes = [], {}, []
    for rt in runtimes:
        cs, rs, ns = verify_candidates(runtime=rt, threads=threads, files=files, references=refs,
                                       images=test_x, labels=test_y, cache=cache, batch=batch)
        for c in cs:
            c.label = f"{SHORT[rt]}:{c.label}"
            c.settings = {"runtime": rt, **c.settings}
        candidates += cs
        runners.update({f"{SHORT[rt]}:{k}": r for k, r in rs.items()})
        notes += [f"{rt}: {n}" for n in ns]
    fp32_label = f"ort:{files[0].path}"
    fp32 = next(c for c in candidates if c.label == fp32_label)
    if not fp32.verified:
        raise UserError(f"the FP32 file does not verify on onnxruntime: {fp32.note}")
    times = time_candidates(runners, batch=batch, rounds=rounds, runs=runs, warmup=warmup,
                            seed=seed)
    chosen = choose_fastest(candidates, times, fp32_label)
    rows = []
    for c in candidates:
        rows.append({
            "runtime": c.settings["runtime"], "precision": c.precision, "file": c.path,
            "label": c.label, "settings": {k: v for k, v in c.settings.items() if k != "runtime"},
            "runtime_precision": c.runtime_precision, "batch": batch, "threads": threads,
            "streams": c.streams, "size_bytes": c.size_bytes,
            "fp32_ms": fp32.median_ms, "ms": c.median_ms, "p95_ms": c.p95_ms,
            "round_ms": (None if c.label not in times else  # per-round medians, for --repick
                         round_medians(times[c.label]).round(4).tolist()),
            "speedup_vs_ort_fp32": None if c.median_ms is None else fp32.median_ms / c.median_ms,
            "top1": c.test_accuracy, "agreement": c.top1_agreement, "verified": c.verified,
            "recommended": c is chosen, "note": c.note})
    if notes:
        rows[0]["runtime_notes"] = notes
    return rows


def repick(rows: list[dict]) -> dict:
    """Re-apply the recommendation's tie rule (:func:`choose_fastest`, tie margin capped at
    :data:`MAX_MARGIN`) to the stored rows of one model/batch/threads group and return the pick.
    What beat FP32 is read off the rows (their notes). Rows with ``round_ms`` are re-decided
    exactly; older rows (timed before the cap) keep only the ties they had whose median is within
    ``MAX_MARGIN`` of the fastest's (the ratio of medians standing in for the per-round ratio)."""
    fp32 = rows[0]  # measure() writes onnxruntime FP32 first
    if fp32["precision"] != "fp32":
        raise UserError(f"{fp32['label']}: expected onnxruntime FP32 as the group's first row")
    beating = [r for r in rows[1:] if r["verified"] and r["ms"] is not None
               and not (r["note"] or "").startswith(NOT_FASTER_NOTE)]
    if not beating:
        return next(r for r in rows if r["recommended"])
    fastest = min(beating, key=lambda r: r["ms"])
    if all(r.get("round_ms") for r in beating):
        per_round = lambda r: np.asarray(r["round_ms"], dtype=np.float64)[:, None]
        ties = [r for r in beating if not clearly_faster(per_round(fastest), per_round(r))]
    else:
        ties = [r for r in beating if (r["recommended"] or TIE_PHRASE in (r["note"] or ""))
                and fastest["ms"] / r["ms"] >= 1.0 - MAX_MARGIN] or [fastest]
    # older rows have no size: an int8 file counts as smaller than the FP32 one
    size = lambda r: r.get("size_bytes") or (1 if r["precision"].startswith("int8") else 2)
    best = min(ties, key=lambda r: tie_order(size(r), r["runtime_precision"],
                                             r.get("streams", 1), r["ms"]))
    for r in rows:  # notes as choose_fastest writes them
        r["recommended"] = r is best
        if r is best or TIE_PHRASE in (r["note"] or ""):
            r["note"] = ""
        if r in ties and r is not best:
            r["note"] = tie_note(best["label"])
    return best


def accuracy_rows(files: list[CandidateFile], refs: dict, test_x: np.ndarray,
                  test_y: np.ndarray | None, *, runtimes: list[str], threads: int) -> list[dict]:
    """One row per candidate (runtime x file x precision): its verification on all of
    ``test_x`` (:func:`verify_candidates`, no timing), with the float PyTorch model's top-1
    beside it so the loss of each file reads off the row."""
    float_top1 = None if test_y is None else float(
        100.0 * (refs["float"].argmax(1) == test_y).mean())
    rows = []
    for rt in runtimes:
        cs, _, notes = verify_candidates(runtime=rt, threads=threads, files=files,
                                         references=refs, images=test_x, labels=test_y)
        for c in cs:
            rows.append({
                "runtime": rt, "precision": c.precision, "file": c.path,
                "settings": c.settings, "runtime_precision": c.runtime_precision,
                "top1": c.test_accuracy, "float_top1": float_top1,
                "drop": (None if c.test_accuracy is None or float_top1 is None
                         else float_top1 - c.test_accuracy),
                "agreement": c.top1_agreement, "verified": c.verified, "note": c.note,
                "n_images": len(test_x)})
        if notes and rows:
            rows[-1].setdefault("runtime_notes", []).extend(f"{rt}: {n}" for n in notes)
    return rows


def accuracy_markdown(doc: dict) -> list[str]:
    """The accuracy section of the .md: per CPU, a table per model of every candidate."""
    if not doc.get("results"):
        return []
    lines = ["## Accuracy of every file on all test images", "",
             ("Written by `benchmarks/export_runtimes.py --accuracy-only`: every candidate "
              "verified as above, no timing (accuracy depends on the runtime, the precision and "
              "the CPU's instruction set, not on threads or batch). `drop`: top-1 points lost "
              "against the float PyTorch model on the same images; `agree`: top-1 agreement "
              "with the PyTorch model the file implements."), ""]
    for run in doc.get("runs", []):
        note = f" ({run['note']})" if run.get("note") else ""
        lines.append(f"- {run.get('date')}: `{run.get('command')}` on {run.get('machine')}{note}")
    lines.append("")
    for cpu in dict.fromkeys(r["cpu"] for r in doc["results"]):
        rows = [r for r in doc["results"] if r["cpu"] == cpu]
        for model in dict.fromkeys(r["model"] for r in rows):
            group = [r for r in rows if r["model"] == model]
            first = group[0]
            lines += [(f"### {model} ({cpu}, {first['n_images']} test images, float PyTorch "
                       f"top-1 {_fmt(first['float_top1'], '.2f') or '-'} %)"), "",
                      f"`{first['arch']}`", "",
                      "| runtime | precision | file | top-1 % | drop | agree % | verified | note |",
                      "|---|---|---|---|---|---|---|---|"]
            for r in group:
                agree = "" if r["agreement"] is None else f"{100 * r['agreement']:.2f}"
                lines.append(f"| {r['runtime']} | {r['precision']} | {r['file']} | "
                             f"{_fmt(r['top1'], '.2f')} | {_fmt(r['drop'], '+.2f')} | {agree} | "
                             f"{'yes' if r['verified'] else 'no'} | {r.get('note', '')} |")
            lines.append("")
            notes = sorted({n for r in group for n in r.get("runtime_notes", [])})
            if notes:
                lines += ["Runtime notes: " + "; ".join(notes), ""]
    return lines


def _fmt(v: Any, spec: str) -> str:
    return "" if v is None else format(v, spec)


def markdown(doc: dict, accuracy: dict | None = None) -> str:
    lines = ["# Every runtime and precision: mbv3 CIFAR-10 subnets", "",
             "Written by `benchmarks/export_runtimes.py`. Per model, batch and thread count, all "
             "candidates (runtime x file x precision hint) are timed in one paired, interleaved "
             "measurement (median ms per batch); `x ORT FP32` is the speed-up over onnxruntime "
             "FP32 in that same measurement. `top-1`: accuracy (%) of the file on the test "
             "images with that runtime; `agree`: top-1 agreement (%) with the PyTorch model "
             "the file implements (the float model, or for int8 the fake-quant model with its "
             "requantization). Verified: agreement >= 99 % and top-1 within 0.3 point of the "
             "float PyTorch model. **pick**: the recommendation rule's choice (the fastest "
             "verified candidate, only when faster than onnxruntime FP32 overall and in both "
             "halves of the measurement). Rows of one table are paired; absolute times across "
             "tables and runs move with the machine's load. Precisions: `int8` is the exact "
             "QDQ file (`qdq/`, Q/DQ where the fake-quant model has them), `int8-requant` the "
             "same requantized so every layer is an onnxruntime integer kernel (`qdq-requant/`); "
             "`+bf16`/`+f16`: OpenVINO's INFERENCE_PRECISION_HINT; `xN`: OpenVINO with "
             "NUM_STREAMS N, the batch run as N sub-batches on parallel infer requests "
             "sharing the threads.", ""]
    for run in doc.get("runs", []):
        note = f" ({run['note']})" if run.get("note") else ""
        lines.append(f"- {run.get('date')}: `{run.get('command')}` on {run.get('machine')}{note}")
    lines.append("")
    if doc.get("findings"):  # the reader's summary of the figures below, kept in the JSON
        lines += ["## What the figures show", ""] + [f"- {f}" for f in doc["findings"]] + [""]
    for cpu in dict.fromkeys(r["cpu"] for r in doc.get("results", [])):
        rows = [r for r in doc["results"] if r["cpu"] == cpu]
        lines += [f"## {cpu}", ""]
        summary = ["| model | batch | threads | ORT FP32 ms | pick | pick ms | x ORT FP32 | "
                   "pick top-1 % | FP32 top-1 % |", "|---|---|---|---|---|---|---|---|---|"]
        for key in dict.fromkeys((r["model"], r["batch"], r["threads"]) for r in rows):
            group = [r for r in rows if (r["model"], r["batch"], r["threads"]) == key]
            pick = next(r for r in group if r["recommended"])
            base = next(r for r in group if r["runtime"] == "onnxruntime"
                        and r["precision"] == "fp32")
            summary.append(f"| {key[0]} | {key[1]} | {key[2]} | {base['fp32_ms']:.2f} | "
                           f"{candidate_name(pick, pick['runtime'])} | {pick['ms']:.2f} | "
                           f"{pick['speedup_vs_ort_fp32']:.2f}x | {_fmt(pick['top1'], '.2f')} | "
                           f"{_fmt(base['top1'], '.2f')} |")
        lines += ["Picks:", ""] + summary + ["", "All candidates:", "",
                                             "| model | batch | threads | runtime | precision | "
                                             "ms | x ORT FP32 | top-1 % | agree % | verified | "
                                             "pick | note |",
                                             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            agree = "" if r["agreement"] is None else f"{100 * r['agreement']:.2f}"
            lines.append(
                f"| {r['model']} | {r['batch']} | {r['threads']} | {r['runtime']} | "
                f"{precision_name(r)} | {_fmt(r['ms'], '.2f')} | "
                f"{_fmt(r['speedup_vs_ort_fp32'], '.2f')} | {_fmt(r['top1'], '.2f')} | {agree} | "
                f"{'yes' if r['verified'] else 'no'} | {'**pick**' if r['recommended'] else ''} | "
                f"{r.get('note', '')} |")
        lines.append("")
        notes = sorted({n for r in rows for n in r.get("runtime_notes", [])})
        if notes:
            lines += ["Runtime notes: " + "; ".join(notes), ""]
    lines += accuracy_markdown(accuracy or {})
    return "\n".join(lines) + "\n"


def merge(out: Path, doc: dict, merge_rows: bool,
          fields: tuple[str, ...] = ("model", "cpu", "batch", "threads")) -> dict:
    """``doc`` merged into the JSON at ``out``: rows keyed by ``fields`` (the accuracy table's
    rows by model and cpu)."""
    run = {k: doc[k] for k in ("command", "machine", "date", "note")}
    if not (merge_rows and out.is_file()):
        doc["runs"] = [run]
        return doc
    old = json.loads(out.read_text())
    key = lambda r: tuple(r[f] for f in fields)
    new = {key(r) for r in doc["results"]}
    doc["results"] = [r for r in old.get("results", []) if key(r) not in new] + doc["results"]
    runs = [r for r in old.get("runs", []) if r.get("date") != doc["date"]]
    if old.get("findings"):
        doc.setdefault("findings", old["findings"])
    doc["runs"] = runs + [run]
    return doc


def write_markdown(out: Path, acc_out: Path) -> None:
    """The .md beside ``out`` from the timing JSON and the accuracy JSON, whichever exist."""
    def read(path: Path) -> dict:
        return json.loads(path.read_text()) if path.is_file() else {}

    write_atomic(out.with_suffix(".md"), markdown(read(out), read(acc_out)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(ROLES), help="largest middle smallest")
    p.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--runtimes", nargs="+", default=list(RUNTIMES))
    p.add_argument("--data", default="cifar10", help="dataset ('' = random images, no accuracy)")
    p.add_argument("--calib-images", type=int, default=256)
    p.add_argument("--test-images", type=int, default=10000,
                   help="test images for agreement and accuracy (default all 10,000)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    p.add_argument("--runs", type=int, default=5, help="timed calls per candidate and round")
    p.add_argument("--checkpoint", help="mbv3 CIFAR-10 supernet checkpoint (default: shipped)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(HERE / "export_runtimes.json"))
    p.add_argument("--merge", action="store_true", help="keep other rows already in --out")
    p.add_argument("--note", default="", help="a note on this run, written in the report")
    p.add_argument("--markdown-only", action="store_true", help="only rewrite the .md")
    p.add_argument("--repick", action="store_true",
                   help="re-apply the current tie rule to the stored rows of --out, then "
                        "rewrite the .md (no measuring)")
    p.add_argument("--accuracy-only", action="store_true",
                   help="verify every candidate on the test images, no timing; write "
                        "--accuracy-out (batches, rounds and runs are not used)")
    p.add_argument("--accuracy-out", help="the accuracy table (default: beside --out, "
                                          "<name>_accuracy.json)")
    args = p.parse_args(argv)
    out = Path(args.out)
    acc_out = Path(args.accuracy_out or out.with_name(f"{out.stem}_accuracy.json"))
    if args.repick:
        doc = json.loads(out.read_text())
        groups: dict[tuple, list[dict]] = {}
        for r in doc["results"]:
            groups.setdefault((r["cpu"], r["model"], r["batch"], r["threads"]), []).append(r)
        for key, rows in groups.items():
            before = next(r["label"] for r in rows if r["recommended"])
            after = repick(rows)["label"]
            if after != before:
                print(f"{' '.join(map(str, key))}: {before} -> {after}")
        write_atomic(out, json.dumps(doc, indent=1) + "\n")
    if args.markdown_only or args.repick:
        write_markdown(out, acc_out)
        return 0
    export_ort.check_models(args.models)
    if any(r not in RUNTIMES for r in args.runtimes) or "onnxruntime" not in args.runtimes:
        raise UserError(f"--runtimes: expected onnxruntime and optionally openvino, got "
                        f"{args.runtimes}")
    if "openvino" in args.runtimes and not openvino_available():
        raise UserError("--runtimes openvino needs OpenVINO: pip install 'hwnas[openvino]'")
    batches, threads = int_list("--batches", args.batches), int_list("--threads", args.threads)
    for name in ("rounds", "runs", "test_images", "calib_images"):
        int_list(f"--{name.replace('_', '-')}", [getattr(args, name)])
    torch.set_num_threads(max(threads))
    command = export_ort.command_line(argv)
    vnni, flags = export_ort.integer_dot_product()
    cpu = f"{cpu_model()}, {os.cpu_count()} logical CPUs"  # one model name, several hosts
    import onnxruntime as ort

    versions = f"onnxruntime {ort.__version__}"
    if "openvino" in args.runtimes:
        import openvino as ov

        versions += f", OpenVINO {ov.__version__}"
    machine = (f"{cpu}, {versions}, flags: "
               f"{' '.join(flags) or 'none'}")
    print(f"# {machine}", flush=True)

    from hwnas.supernet.evaluate import recalibrated_subnet
    from hwnas.supernet.train import with_training_augment

    ckpt, space, supernet, payload = export_ort.load_mbv3(args.checkpoint)
    calib, test, source, data = export_ort.images(args.data or None, args.calib_images,
                                                  args.test_images, args.seed)
    if test is None:  # random images: agreement only
        g = torch.Generator().manual_seed(args.seed + 1)
        test = (torch.randn(args.test_images, 3, 32, 32, generator=g), None)
    test_x, test_y = test
    np_x, np_y = test_x.numpy(), None if test_y is None else test_y.numpy()
    config = PTQConfig(max_images=args.calib_images, seed=args.seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    acc_out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"command": command, "machine": machine, "checkpoint": str(ckpt),
           "date": datetime.now(UTC).isoformat(timespec="seconds"), "note": args.note,
           "calibration": source, "rounds": args.rounds, "runs": args.runs, "results": []}
    acc_doc = {"command": command, "machine": machine, "checkpoint": str(ckpt),
               "date": doc["date"], "note": args.note, "calibration": source,
               "threads": max(threads), "results": []}
    start = time.perf_counter()
    for role in args.models:
        arch = export_ort.subnet_archs(space)[role]
        model = (recalibrated_subnet(supernet, arch, with_training_augment(
            data, payload.get("train_config"))) if data is not None
            else supernet.extract(arch)).eval()
        files, refs = export_files(role, model, calib, test_x, config)
        if args.accuracy_only:
            rows = accuracy_rows(files, refs, np_x, np_y, runtimes=args.runtimes,
                                 threads=max(threads))
            for r in rows:
                r.update({"model": role, "arch": space.to_string(arch), "cpu": cpu,
                          "flags": flags})
                print(f"{role:8s} {SHORT[r['runtime']]} {r['precision']:18s} top-1 "
                      f"{_fmt(r['top1'], '6.2f')} agree {_fmt(r['agreement'], '.4f')} "
                      f"{'verified' if r['verified'] else 'NOT verified: ' + r['note']}",
                      flush=True)
            acc_doc["results"] += rows
            acc_doc["seconds"] = round(time.perf_counter() - start, 1)
            merged = merge(acc_out, json.loads(json.dumps(acc_doc)), args.merge, ("model", "cpu"))
            write_atomic(acc_out, json.dumps(merged, indent=1) + "\n")
            write_markdown(out, acc_out)
            continue
        cache: dict = {}
        for batch in batches:
            for t in threads:
                rows = measure(files, refs, np_x, np_y, runtimes=args.runtimes, batch=batch,
                               threads=t, rounds=args.rounds, runs=args.runs, warmup=3,
                               cache=cache, seed=args.seed)
                for r in rows:
                    r.update({"model": role, "arch": space.to_string(arch), "cpu": cpu,
                              "integer_dot_product": vnni})
                doc["results"] += rows
                pick = next(r for r in rows if r["recommended"])
                print(f"{role:8s} batch {batch:3d} threads {t}: ORT FP32 {rows[0]['fp32_ms']:8.2f}"
                      f" ms | " + " | ".join(
                          f"{candidate_name(r)} "
                          + (f"{r['ms']:.2f} ({r['speedup_vs_ort_fp32']:.2f}x)" if r['ms']
                             else "-") + ("" if r["verified"] else " unverified")
                          for r in rows[1:])
                      + f" | pick {candidate_name(pick)}", flush=True)
                doc["seconds"] = round(time.perf_counter() - start, 1)
                # written after every group, so a run cut off later keeps what it measured
                merged = merge(out, json.loads(json.dumps(doc)), args.merge)
                write_atomic(out, json.dumps(merged, indent=1) + "\n")
                write_markdown(out, acc_out)
    print(f"wrote {acc_out if args.accuracy_only else out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    export_ort.run_script(main, "export_runtimes")
