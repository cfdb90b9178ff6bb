"""The GPU matrix's scheduler (benchmarks/gpu_matrix.py): cells run ``--jobs`` at a time, a cell
waits for the cell it needs, and none starts after the budget."""

import threading
import time

from benchmarks.gpu_matrix import schedule


def _run_all(todo, jobs, budget_s=1e9):
    lock, events, results = threading.Lock(), [], []

    def run(cell):
        with lock:
            events.append(("start", cell["id"]))
        time.sleep(cell.get("sleep", 0.05))
        with lock:
            events.append(("end", cell["id"]))
        return {"id": cell["id"], "status": "pass"}

    schedule(todo, run, results.append, jobs, budget_s)
    return events, results


def test_cells_overlap_up_to_jobs_and_wait_for_what_they_need():
    todo = [{"id": "run/a", "sleep": 0.3}, {"id": "export/a", "needs": "run/a"},
            {"id": "run/b", "sleep": 0.1}, {"id": "run/c"}]
    events, results = _run_all(todo, jobs=2)
    assert sorted(r["id"] for r in results) == sorted(c["id"] for c in todo)
    order = [e for e in events]
    # export/a starts only after run/a ended; run/b ran beside run/a
    assert order.index(("start", "export/a")) > order.index(("end", "run/a"))
    assert order.index(("start", "run/b")) < order.index(("end", "run/a"))
    # never more than two at a time
    live = peak = 0
    for kind, _ in events:
        live += 1 if kind == "start" else -1
        peak = max(peak, live)
    assert peak == 2


def test_one_job_keeps_the_order_and_a_spent_budget_starts_nothing():
    todo = [{"id": "x"}, {"id": "y"}, {"id": "z"}]
    events, _ = _run_all(todo, jobs=1)
    assert [i for k, i in events if k == "start"] == ["x", "y", "z"]
    events, results = _run_all(todo, jobs=3, budget_s=-1)
    assert events == [] and results == []


def test_a_cell_whose_kept_source_run_is_elsewhere_runs_the_source_first(tmp_path):
    """Session 40: export/mbv3/digits/cuda-adaround, selected alone on a fresh machine, failed
    on the kept run/mbv3/digits/bits' directory (another session's /tmp)."""
    from benchmarks.gpu_matrix import with_sources

    matrix = [{"id": "run/a"}, {"id": "run/b"}, {"id": "export/a", "needs": "run/a"},
              {"id": "export/b", "needs": "run/b"}]
    kept = {"run/a": {"id": "run/a", "rc": 0, "run_dir": str(tmp_path / "gone")},
            "run/b": {"id": "run/b", "rc": 0, "run_dir": str(tmp_path)}}
    todo = with_sources([matrix[2], matrix[3]], matrix, kept)
    assert [c["id"] for c in todo] == ["run/a", "export/a", "export/b"]
    assert set(kept) == {"run/b"}  # run/a runs again; run/b's directory is here
    events, results = _run_all(todo, jobs=3)
    assert events.index(("start", "export/a")) > events.index(("end", "run/a"))


def _teacher_cell(suffix, tmp_path, monkeypatch):
    """The matrix cell whose id ends with ``suffix``, its passed source cell, the arguments
    ``run_cell`` takes, and the command lines it runs (``run_cli`` recorded, not run)."""
    import argparse

    import benchmarks.gpu_matrix as gm

    seen = []
    monkeypatch.setattr(gm, "run_cli", lambda args, timeout: (seen.append(args), (0, "", 1.0))[1])
    cell = next(c for c in gm.cells(["cct"]) if c["id"].endswith(suffix))
    source = {"id": cell["needs"], "rc": 0, "run_dir": str(tmp_path / "src")}
    a = argparse.Namespace(device="cuda", epochs=1, limit_train=100, cell_timeout=10,
                           results_by_id={cell["needs"]: source})
    return gm, cell, source, a, seen


def test_a_teacher_cell_learns_from_the_supernet_its_source_cell_trained(tmp_path, monkeypatch):
    """The standalone teacher cell passes its source cell's supernet as ``--teacher`` (a shipped
    file would be refused: it trained on the matrix subset's validation images), and is skipped
    when that cell failed."""
    gm, cell, source, a, seen = _teacher_cell("standalone-teacher-graphed", tmp_path, monkeypatch)
    res = gm.run_cell(cell, tmp_path, a)
    assert res["rc"] == 0 and res["run_dir"] == str(tmp_path / cell["id"].replace("/", "_"))
    args = seen[0]
    assert args[args.index("--teacher") + 1] == str(tmp_path / "src" / "supernet.pt")
    assert "reduce-overhead" in args and "--standalone" in args

    source["rc"] = 1
    res = gm.run_cell(cell, tmp_path, a)
    assert res["rc"] == 1 and "skipped" in res["error"] and len(seen) == 1


def test_the_regularise_cell_trains_a_graphed_supernet_like_the_cct_run(tmp_path, monkeypatch):
    """The --regularise largest cell trains a graphed supernet (a 1-epoch deps schedule is all
    sandwich steps, so the subnets' graphs run with the switch off) with its source cell's
    supernet as the teacher, as the 200-epoch CCT run does."""
    from hwnas.supernet import get_space
    from hwnas.supernet.recipes import default_config

    stages = default_config(get_space("cct"), 1).stages
    assert all(st.sandwich for st in stages if st.epochs > 0)

    gm, cell, source, a, seen = _teacher_cell("supernet-regularise-largest-graphed", tmp_path,
                                              monkeypatch)
    assert gm.run_cell(cell, tmp_path, a)["rc"] == 0
    args = seen[0]
    assert args[args.index("--teacher") + 1] == str(tmp_path / "src" / "supernet.pt")
    assert args[args.index("--regularise") + 1] == "largest"
    assert "--standalone" not in args and args[args.index("--compile-scope") + 1] == "subnets"


def test_the_surrogate_cells_run_past_the_screening_start_up(tmp_path, monkeypatch):
    """The surrogate cells search the supernet of their run cell with enough trials that the
    default sampler's surrogate chooses at least 4 after its start-up (extended by the run's
    seed trials: 2 float, 6 with bits; the 4-6-trial run cells never reach it), with two
    objectives (the 2-D EHVI) and three (the scalarization), and fail when fewer were surely
    chosen."""
    import argparse
    from pathlib import Path

    import benchmarks.gpu_matrix as gm
    from hwnas.search.candidates import ScreeningConfig

    c = ScreeningConfig()
    start = c.n_startup_trials + c.cheap_front_trials
    cells = {x["id"]: x for x in gm.cells(["nb201", "mbv3-tiny", "cct"])}
    sur = [i for i in cells if "-surrogate-" in i]
    assert sur == ["search/nb201/digits/float-surrogate-ehvi",
                   "search/mbv3-tiny/digits/bits-surrogate-parego"]
    assert [cells[i]["needs"] for i in sur] == ["run/nb201/digits/float",
                                                "run/mbv3-tiny/digits/bits"]
    want = start + 6 + 4
    seen = []

    def fake_run(args, timeout, seeds=(2, 7)):  # the 2nd run: one seed more than the bits run's
        seen.append(args)
        r = Path(args[args.index("--out") + 1]) / "r"
        r.mkdir(parents=True, exist_ok=True)
        n, k = int(args[args.index("--trials") + 1]), seeds[len(seen) - 1]
        (r / "trials.csv").write_text("trial,seed\n" + "".join(
            f"{i},{'s' if i < k else ''}\n" for i in range(n)))
        return 0, "", 1.0

    monkeypatch.setattr(gm, "run_cli", fake_run)
    src = {"rc": 0, "run_dir": str(tmp_path / "src")}
    a = argparse.Namespace(device="cuda", epochs=1, trials=4, cell_timeout=10, results_by_id={
        "run/nb201/digits/float": src, "run/mbv3-tiny/digits/bits": src})
    res = gm.run_cell(cells["search/nb201/digits/float-surrogate-ehvi"], tmp_path, a)
    args = seen[0]
    assert args[0] == "search" and args[args.index("--trials") + 1] == str(want)
    assert args[args.index("--supernet") + 1] == str(tmp_path / "src" / "supernet.pt")
    assert "--no-bits" in args
    assert args[args.index("--objectives") + 1] == "accuracy,latency:edgetpu-est"
    assert res["rc"] == 0 and res["trials"] == want and res["surrogate_trials"] == want - start - 2
    res = gm.run_cell(cells["search/mbv3-tiny/digits/bits-surrogate-parego"], tmp_path, a)
    assert "--no-bits" not in seen[1] and "--objectives" not in seen[1]
    assert res["rc"] == 1 and res["surrogate_trials"] == 3
    assert res["error"] == f"3 of {want} trials surely chosen by the surrogate; expected >= 4"
