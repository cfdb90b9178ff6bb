"""The GPU matrix: every registered space and every stage through the command line on a GPU.

CI runs on CPUs only, so this is the one place where the GPU paths a user takes are run:
``hwnas run --device cuda`` for every registered space x {float (``--no-bits``), searched bits}
x {digits, cifar10}, plus ``hwnas train`` (each schedule, bf16 and fp32, a standalone subnet
compiled, ``--resume`` after a SIGKILL), ``hwnas search`` past the default sampler's start-up,
``hwnas finetune`` of a quantized trial and ``hwnas export --device cuda``. Each cell records
pass/fail, the first error line, wall seconds, the seconds per stage that the commands print
and the training images/s.

Budgets are small (a smoke matrix, not a benchmark of accuracy). Cells run one after the other,
or ``--jobs N`` at a time (pass/fail then as alone; seconds are upper bounds, the timings of
the issue are measured alone); a cell waits for the cell it needs. Results are written after
every cell, and cells already in ``--results`` are skipped, so a
command cut off by its time limit resumes where it stopped::

    # on the GPU machine, with a stratified CIFAR-10 subset under $HWNAS_SHARED_DATA/cifar10
    python benchmarks/gpu_matrix.py --out $OUT --budget-s 540
    python benchmarks/gpu_matrix.py --results prev/gpu_matrix.json --out $OUT   # resume

Writes ``gpu_matrix.json`` and ``gpu_matrix.md`` into ``--out`` (commit them as
``benchmarks/gpu_matrix.{json,md}``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
HWNAS = [sys.executable, "-m", "hwnas"]

#: (pattern, key) of the lines ``hwnas run`` / ``train`` print with a stage's seconds
STAGE_LINES = (
    (re.compile(r"trained supernet .*: (\d+) epochs? in ([\d.]+) s \(([\d.]+) images/s\)"), "train"),
    (re.compile(r"sensitivity seeds: .* in ([\d.]+) s"), "sensitivity"),
    (re.compile(r"search: .* new by this process in ([\d.]+) s"), "search"),
    (re.compile(r"exported \d+ of \d+ .* in ([\d.]+) s"), "export"),
    (re.compile(r"wall time: ([\d.]+) s"), "wall"),
)
IMAGES_PER_S = re.compile(r"([\d.]+) images/s")
#: trials the default sampler's surrogate must choose in a surrogate cell
SURROGATE_PAST = 4


def first_error(text: str) -> str | None:
    """The line a user would read first: ``hwnas: error: ...``, else a traceback's last line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("hwnas: error:"):
            return ln
    for i, ln in enumerate(lines):
        if ln.startswith("Traceback"):
            tail = [x for x in lines[i:] if re.match(r"^[A-Za-z_.]+(Error|Exception)\b", x)]
            return tail[0] if tail else lines[-1]
    failed = [ln for ln in lines if "failed" in ln.lower()]
    return failed[0] if failed else (lines[-1] if lines else None)


def stages(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for pattern, key in STAGE_LINES:
        m = pattern.search(text)
        if m:
            out[f"{key}_s"] = float(m.group(2) if key == "train" else m.group(1))
            if key == "train":
                out["train_images_per_s"] = float(m.group(3))
    if "train_images_per_s" not in out:
        rates = IMAGES_PER_S.findall(text)
        if rates:
            out["train_images_per_s"] = float(rates[-1])
    return out


def run_cli(args: list[str], timeout: float, env: dict | None = None) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(HWNAS + args, capture_output=True, text=True, timeout=timeout,
                           env=env)
        return p.returncode, p.stdout + p.stderr, time.perf_counter() - t0
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out + f"\nTIMEOUT after {timeout:.0f} s", time.perf_counter() - t0


def export_failures(run_dir: Path) -> list[str]:
    """Files the export could not verify (the manifest's failed entries), as one line each."""
    manifest = run_dir / "export" / "manifest.json"
    if not manifest.exists():
        return ["no export/manifest.json"]
    data = json.loads(manifest.read_text())
    bad = [f"{f}" for f in data.get("failed") or []]
    for m in data.get("models", []):
        bad += [f"{m['name']}: {e}" for e in m.get("errors") or []]
        for f in m.get("files", []):
            if f.get("status") != "ok" or f.get("error"):
                bad.append(f"{f.get('path')}: {f.get('error') or f.get('status')}")
    return bad


def start_up_trials() -> int:
    """Trials before the default screening sampler's surrogate chooses, besides the run's seed
    trials (which ``hwnas.search.samplers.make_sampler`` adds to its random phase): the random
    trials and, at most, the cheap-front plan (none where no cheap objective ranks the
    candidates, e.g. with searched bits)."""
    from hwnas.search.candidates import ScreeningConfig

    c = ScreeningConfig()
    return c.n_startup_trials + c.cheap_front_trials


def surrogate_trials(seeds: int = 6) -> int:
    """Trials of a run whose surrogate chooses at least ``SURROGATE_PAST`` of them, with up to
    ``seeds`` seed trials (2 float, 6 with searched bits)."""
    return start_up_trials() + seeds + SURROGATE_PAST


def chosen_by_surrogate(rows: list[dict]) -> int:
    """At least this many trials of a finished run (``trials.csv`` rows) were chosen by the
    screening sampler's surrogate: those after its start-up and the run's seed trials."""
    return len(rows) - sum(1 for r in rows if r.get("seed")) - start_up_trials()


def cells(spaces: list[str], base: str = "mbv3") -> list[dict]:
    """The matrix: run cells first (what users run), then the training / finetune / export ones."""
    out = []
    for dataset in ("digits", "cifar10"):
        for space in spaces:
            for bits in (False, True):
                if space == "mbv3-tiny" and dataset == "cifar10":
                    continue  # an 8x8 single-channel space: digits only (UserError otherwise)
                out.append({"id": f"run/{space}/{dataset}/{'bits' if bits else 'float'}",
                            "kind": "run", "space": space, "dataset": dataset, "bits": bits})
    # the default sampler (screening) lets its surrogate choose only after its start-up trials,
    # which the 4-6-trial run cells never pass: `hwnas search` on the supernet of a run cell,
    # past them, with two objectives (its 2-D EHVI, float) and the run's three (its
    # scalarization, searched bits); no export (the run cells export)
    for space, bits, path, extra in (
            ("nb201", False, "ehvi", ["--objectives", "accuracy,latency:edgetpu-est"]),
            ("mbv3-tiny", True, "parego", [])):
        if space in spaces:
            kind = "bits" if bits else "float"
            out.append({"id": f"search/{space}/digits/{kind}-surrogate-{path}", "kind": "search",
                        "space": space, "dataset": "digits", "bits": bits,
                        "needs": f"run/{space}/digits/{kind}",
                        "trials": surrogate_trials(), "args": extra})
    for schedule in ("sandwich", "progressive", "deps"):
        out.append({"id": f"train/mbv3/digits/{schedule}", "kind": "train", "space": "mbv3",
                    "dataset": "digits", "args": ["--schedule", schedule]})
    out.append({"id": "train/mbv3/cifar10/bf16", "kind": "train", "space": "mbv3",
                "dataset": "cifar10", "args": ["--precision", "bf16"]})
    out.append({"id": "train/mbv3/cifar10/fp32", "kind": "train", "space": "mbv3",
                "dataset": "cifar10", "args": ["--precision", "fp32"]})
    out.append({"id": "train/vit/cifar10/standalone-compiled", "kind": "train", "space": "vit",
                "dataset": "cifar10", "args": ["--standalone", "smallest", "--compile"]})
    # a supernet step under CUDA graphs (several backward passes: session 41's gradient copy)
    # with its random subnets as one masked graph (compile scope "subnets")
    out.append({"id": "train/cct/cifar10/graphed-subnets", "kind": "train", "space": "cct",
                "dataset": "cifar10",
                "args": ["--compile", "reduce-overhead", "--compile-scope", "subnets"]})
    # a standalone network learning from the supernet above under CUDA graphs: the teacher's
    # logits must outlive the student's graph replay. The teacher is trained on the same
    # images (a shipped file, trained on the full split, is refused as a leak of these).
    out.append({"id": "train/cct/cifar10/standalone-teacher-graphed", "kind": "train",
                "space": "cct", "dataset": "cifar10", "needs": "train/cct/cifar10/graphed-subnets",
                "args": ["--standalone", "smallest", "--compile", "reduce-overhead"]})
    # a graphed supernet whose smaller subnets train without dropout and stochastic depth
    # (--regularise largest): their graphs are captured with the switch off, the largest's on
    out.append({"id": "train/cct/cifar10/supernet-regularise-largest-graphed", "kind": "train",
                "space": "cct", "dataset": "cifar10", "needs": "train/cct/cifar10/graphed-subnets",
                "args": ["--compile", "reduce-overhead", "--compile-scope", "subnets",
                         "--regularise", "largest"]})
    out.append({"id": "train/mbv3/cifar10/resume-after-kill", "kind": "resume", "space": "mbv3",
                "dataset": "cifar10"})
    out.append({"id": f"finetune/{base}/digits/quantized-trial", "kind": "finetune",
                "needs": f"run/{base}/digits/bits"})
    out.append({"id": f"export/{base}/digits/cuda", "kind": "export", "needs": f"run/{base}/digits/bits"})
    # learned rounding (AdaRound's Adam loops) on the GPU: the files with weights below 6 bits
    out.append({"id": f"export/{base}/digits/cuda-adaround", "kind": "export",
                "needs": f"run/{base}/digits/bits", "args": ["--rounding", "adaround"]})
    out.append({"id": "export/vit/cifar10/cuda", "kind": "export", "needs": "run/vit/cifar10/bits"})
    return out


def run_cell(cell: dict, work: Path, a: argparse.Namespace) -> dict:
    res: dict = {"id": cell["id"]}
    common = ["--device", a.device, "--quiet"]
    source = a.results_by_id.get(cell["needs"]) if cell.get("needs") else None
    if cell.get("needs") and (not source or source.get("rc") != 0):
        return {**res, "rc": 1, "status": "fail", "error": f"skipped: {cell['needs']} did not pass"}
    if cell["kind"] == "run":
        out = work / cell["id"].replace("/", "_")
        args = ["run", "--space", cell["space"], "--dataset", cell["dataset"], *common,
                # searched bits: 2 trials more than the 4 plain seeds, so that the Hessian seeds
                # (computed only when a trial runs them) run on the GPU too
                "--trials", str(a.trials + 2 if cell["bits"] else a.trials),
                "--epochs", str(a.epochs), "--out", str(out),
                "--name", "r", "--overwrite"]
        if not cell["bits"]:
            args.append("--no-bits")
        rc, text, wall = run_cli(args, a.cell_timeout)
        res.update(rc=rc, seconds=round(wall, 1), **stages(text))
        res["run_dir"] = str(out / "r")
        if rc == 0:
            bad = export_failures(out / "r")
            if bad:
                res.update(rc=1, error=f"{len(bad)} file(s) failed: {bad[0]}")
    elif cell["kind"] == "search":  # the surrogate's trials ran, not only the start-up
        out = work / cell["id"].replace("/", "_")
        args = ["search", "--space", cell["space"], "--dataset", cell["dataset"], *common,
                "--supernet", str(Path(source["run_dir"], "supernet.pt")),
                "--trials", str(cell["trials"]), "--out", str(out), "--name", "r", "--overwrite",
                *([] if cell["bits"] else ["--no-bits"]), *cell["args"]]
        rc, text, wall = run_cli(args, a.cell_timeout)
        res.update(rc=rc, seconds=round(wall, 1), run_dir=str(out / "r"), **stages(text))
        if rc == 0:
            with open(out / "r" / "trials.csv", newline="") as f:
                rows = list(csv.DictReader(f))
            res.update(trials=len(rows), surrogate_trials=chosen_by_surrogate(rows))
            if res["surrogate_trials"] < SURROGATE_PAST:
                res.update(rc=1, error=f"{res['surrogate_trials']} of {len(rows)} trials surely "
                                       f"chosen by the surrogate; expected >= {SURROGATE_PAST}")
    elif cell["kind"] == "train":
        out = work / cell["id"].replace("/", "_")
        shutil.rmtree(out, ignore_errors=True)
        args = ["train", "--space", cell["space"], "--dataset", cell["dataset"], *common,
                "--epochs", str(a.epochs), "--out", str(out), *cell["args"]]
        if source:  # the teacher: the supernet that the cell it needs trained
            args += ["--teacher", str(Path(source["run_dir"], "supernet.pt"))]
        if cell["dataset"] == "cifar10":
            args += ["--limit-train", str(a.limit_train), "--limit-eval", "1000", "--eval"]
        rc, text, wall = run_cli(args, a.cell_timeout)
        res.update(rc=rc, seconds=round(wall, 1), run_dir=str(out), **stages(text))
    elif cell["kind"] == "resume":
        out = work / "resume"
        shutil.rmtree(out, ignore_errors=True)
        args = ["train", "--space", cell["space"], "--dataset", cell["dataset"], *common,
                "--epochs", "3", "--limit-train", str(a.limit_train), "--limit-eval", "1000",
                "--checkpoint-every-s", "3", "--out", str(out)]
        t0 = time.perf_counter()
        proc = subprocess.Popen(HWNAS + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        ckpt, killed = out / "checkpoint.pt", False
        while proc.poll() is None and time.perf_counter() - t0 < a.cell_timeout:
            if ckpt.exists() and time.perf_counter() - t0 > 15:
                os.killpg(proc.pid, signal.SIGKILL)
                killed = True
                break
            time.sleep(0.5)
        proc.wait()
        res["killed_at_s"] = round(time.perf_counter() - t0, 1) if killed else None
        if not killed:
            res.update(rc=1, error="training ended before a checkpoint could be killed")
        else:
            rc, text, wall = run_cli(["train", "--out", str(out), "--resume", *common],
                                     a.cell_timeout)
            done = (out / "supernet.pt").exists()
            res.update(rc=rc if done or rc else 1, seconds=round(time.perf_counter() - t0, 1),
                       **stages(text))
            if rc == 0 and not done:
                res["error"] = "resumed run wrote no supernet.pt"
    else:
        run_dir = source["run_dir"]
        if cell["kind"] == "finetune":
            with open(Path(run_dir, "trials.csv"), newline="") as f:
                rows = list(csv.DictReader(f))
            quant = [r for r in rows if r.get("bits", "float") not in ("float", "")]
            if not quant:
                return {**res, "rc": 1, "status": "fail", "error": "no quantized trial in the run"}
            args = ["finetune", run_dir, "--trial", quant[0]["trial"], "--epochs", "1",
                    *common, "--overwrite"]
        else:  # an export of its own options writes its own folder (cells may run at once)
            export_dir = (Path(run_dir, "export") if not cell.get("args")
                          else work / cell["id"].replace("/", "_") / "export")
            args = ["export", run_dir, *common, *cell.get("args", [])]
            if cell.get("args"):
                args += ["--out", str(export_dir)]
        rc, text, wall = run_cli(args, a.cell_timeout)
        res.update(rc=rc, seconds=round(wall, 1), **stages(text))
        if cell["kind"] == "export" and rc == 0:
            bad = export_failures(export_dir.parent)
            if bad:
                res.update(rc=1, error=f"{len(bad)} file(s) failed: {bad[0]}")
    if res.get("rc") and "error" not in res:
        res["error"] = first_error(text)
    if res.get("rc"):
        res["log_tail"] = text[-3000:]
    res["status"] = "pass" if res.get("rc") == 0 else "fail"
    return res


def stratified_subset(src: Path, dst: Path, per_class_train: int, per_class_test: int,
                      seed: int = 0) -> None:
    """A class-stratified subset of a cifar10-jpeg ``.npz`` (its splits are sorted by class, so
    a plain head would hold one or two classes)."""
    import numpy as np

    d, rng, out = np.load(src), np.random.default_rng(seed), {}
    for split, n in (("train", per_class_train), ("test", per_class_test)):
        labels, offsets, jpeg = d[f"{split}_labels"], d[f"{split}_offsets"], d[f"{split}_jpeg"]
        idx = np.sort(np.concatenate([rng.choice(np.flatnonzero(labels == c), n, replace=False)
                                      for c in np.unique(labels)]))
        chunks = [jpeg[offsets[i]:offsets[i + 1]] for i in idx]
        o = np.zeros(len(idx) + 1, np.int64)
        o[1:] = np.cumsum([len(c) for c in chunks])
        out.update({f"{split}_jpeg": np.concatenate(chunks), f"{split}_offsets": o,
                    f"{split}_labels": labels[idx]})
    dst.parent.mkdir(parents=True, exist_ok=True)
    np.savez(dst, classes=d["classes"], **out)


def machine() -> dict:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "gpu": gpu, "torch": torch.__version__, "python": platform.python_version()}


def write(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)
    rows = ["| cell | status | s | train img/s | stages (s) | first error |", "|---|---|---:|---:|---|---|"]
    for r in doc["cells"]:
        st = ", ".join(f"{k[:-2]} {v:g}" for k, v in r.items()
                       if k.endswith("_s") and k not in ("killed_at_s", "train_images_per_s"))
        err = (r.get("error") or "").replace("|", "\\|")[:160]
        rows.append(f"| {r['id']} | {r['status']} | {r.get('seconds', '')} | "
                    f"{r.get('train_images_per_s', '')} | {st} | {err} |")
    passed = sum(r["status"] == "pass" for r in doc["cells"])
    head = (f"# GPU matrix\n\n`{doc['command']}` on {doc['machine'].get('gpu')} "
            f"({doc['date']}): {passed} of {len(doc['cells'])} cells pass.\n\n")
    path.with_suffix(".md").write_text(head + "\n".join(rows) + "\n")


def schedule(todo: list[dict], run, done, jobs: int, budget_s: float) -> None:
    """Run ``todo``'s cells in order, ``jobs`` at a time; a cell whose ``needs`` is still to run
    waits for it. ``done`` gets each result (on this thread); no cell starts after ``budget_s``."""
    t0, pending, running = time.perf_counter(), list(todo), {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        while pending or running:
            busy = {c["id"] for c in pending} | set(running.values())
            for cell in list(pending):
                if len(running) >= max(1, jobs) or time.perf_counter() - t0 > budget_s:
                    break
                if cell.get("needs") not in busy:
                    pending.remove(cell)
                    running[pool.submit(run, cell)] = cell["id"]
            if time.perf_counter() - t0 > budget_s and pending:
                print(f"budget spent: {', '.join(c['id'] for c in pending)} left for the next command")
                pending = []
            if running:
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for f in finished:
                    running.pop(f)
                    done(f.result())


def with_sources(todo: list[dict], matrix: list[dict], kept: dict[str, dict]) -> list[dict]:
    """``todo`` with, before each cell, the cell it needs where that one is kept from an earlier
    run but its run directory is not on this machine (another session's scratch folder): it
    runs again (and leaves ``kept``), else the cell would fail on a missing directory."""
    by_id, out = {c["id"]: c for c in matrix}, []
    for cell in todo:
        need = kept.get(cell.get("needs", ""))
        if need is not None and need["id"] in by_id and not (
                need.get("run_dir") and Path(need["run_dir"]).is_dir()):
            kept.pop(need["id"])
            out.append(by_id[need["id"]])
        out.append(cell)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for gpu_matrix.json/.md")
    p.add_argument("--results", type=Path, help="an earlier gpu_matrix.json: its cells are kept")
    p.add_argument("--only", nargs="*", default=None, help="cell ids (prefixes) to run, in this order")
    p.add_argument("--rerun-failed", action="store_true", help="run the kept failed cells again")
    p.add_argument("--rerun", nargs="*", default=[],
                   help="cell ids (prefixes) to run again though kept (a GPU path they take changed)")
    p.add_argument("--jobs", type=int, default=1, help="cells at a time on the one GPU")
    p.add_argument("--device", default="cuda", help="torch device of every cell (cpu: a smoke test)")
    p.add_argument("--base-space", default="mbv3", help="the space whose digits run is fine-tuned and exported")
    p.add_argument("--trials", type=int, default=4)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--limit-train", type=int, default=5000)
    p.add_argument("--cell-timeout", type=float, default=300)
    p.add_argument("--budget-s", type=float, default=1e9, help="start no cell after this many s")
    p.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temp dir)")
    p.add_argument("--subset-from", type=Path, default=None,
                   help="a full cifar10-jpeg .npz: write a stratified subset (1,000 training and "
                        "500 test images per class) under $HWNAS_SHARED_DATA/cifar10 first")
    a = p.parse_args(argv)
    if a.subset_from is not None:
        from hwnas.core.paths import SHARED_DATA_ENV

        if not os.environ.get(SHARED_DATA_ENV):
            raise SystemExit(f"--subset-from writes the subset under ${SHARED_DATA_ENV}, which "
                             f"is not set: set it to a folder (the cells read their data there)")
        dst = Path(os.environ[SHARED_DATA_ENV]) / "cifar10" / "cifar10-jpeg.npz"
        if not dst.exists():
            stratified_subset(a.subset_from, dst, 1000, 500)
    from hwnas.supernet.spaces import available_spaces  # the registry

    a.out.mkdir(parents=True, exist_ok=True)
    out_json = a.out / "gpu_matrix.json"
    kept = json.loads(a.results.read_text())["cells"] if a.results else []
    if a.rerun_failed:
        kept = [c for c in kept if c["status"] == "pass"]
    kept = [c for c in kept if not any(c["id"].startswith(r) for r in a.rerun)]
    a.results_by_id = {c["id"]: c for c in kept}
    doc = {"command": "python benchmarks/gpu_matrix.py " + " ".join(argv or sys.argv[1:]),
           "machine": machine(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "cells": kept}
    work = a.work or Path(tempfile.mkdtemp(prefix="gpu_matrix_"))
    todo = [c for c in cells(available_spaces(), a.base_space) if c["id"] not in a.results_by_id
            and (a.only is None or any(c["id"].startswith(o) for o in a.only))]
    if a.only:  # in the order --only names them
        todo.sort(key=lambda c: min(i for i, o in enumerate(a.only) if c["id"].startswith(o)))
    todo = with_sources(todo, cells(available_spaces(), a.base_space), a.results_by_id)

    def done(res: dict) -> None:
        print(f"{res['status']:4} {res.get('seconds', 0):7.1f} s  {res['id']}  {res.get('error') or ''}",
              flush=True)
        doc["cells"] = [c for c in doc["cells"] if c["id"] != res["id"]] + [res]
        a.results_by_id[res["id"]] = res
        write(out_json, doc)

    schedule(todo, lambda cell: run_cell(cell, work, a), done, a.jobs, a.budget_s)
    write(out_json, doc)
    return 0 if all(c["status"] == "pass" for c in doc["cells"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
