"""benchmarks/export_runtimes.py's pieces on a tiny untrained mbv3 space: the files, one paired
measurement of every runtime and precision, the rule's pick, the report, and its errors."""

import json

import numpy as np
import pytest
import torch
from hwnas.latency.onnx_measure import Runner, openvino_available
from hwnas.quant.ptq import PTQConfig

from hwnas.core.errors import UserError

er = pytest.importorskip("benchmarks.export_runtimes")


@pytest.fixture(scope="module")
def files():
    from hwnas.supernet.spaces import get_space

    torch.manual_seed(0)
    space = get_space("mbv3-tiny", in_channels=3, image_size=8, num_classes=10)
    model = space.build_supernet().extract(space.smallest()).eval()
    calib = [torch.randn(32, 3, 8, 8)]
    test_x = torch.randn(48, 3, 8, 8)
    test_y = torch.randint(0, 10, (48,))
    fs, refs = er.export_files("smallest", model, calib, test_x,
                               PTQConfig(max_images=32, seed=0))
    return fs, refs, test_x.numpy(), test_y.numpy()


def test_files_and_references(files):
    fs, refs, x, _ = files
    assert [f.kind for f in fs] == ["fp32", "int8", "int8-requant"]
    assert all(f.accuracy_baseline == "float" for f in fs)  # within 0.3 point of FP32
    assert all(refs[f.reference].shape == (len(x), 10) for f in fs)


def test_one_paired_measurement_and_the_pick(files):
    fs, refs, x, y = files
    runtimes = ["onnxruntime"] + (["openvino"] if openvino_available() else [])
    rows = er.measure(fs, refs, x, y, runtimes=runtimes, batch=2, threads=1, rounds=2, runs=1,
                      warmup=0, cache={})
    assert {r["runtime"] for r in rows} == set(runtimes)
    base = rows[0]
    assert (base["runtime"], base["precision"], base["verified"]) == ("onnxruntime", "fp32", True)
    assert base["speedup_vs_ort_fp32"] == 1.0 and base["agreement"] == 1.0
    assert all(r["fp32_ms"] == base["ms"] for r in rows)
    picks = [r for r in rows if r["recommended"]]
    assert len(picks) == 1 and picks[0]["verified"]
    assert picks[0]["ms"] <= base["ms"]  # never slower than onnxruntime FP32
    for r in rows:
        assert (r["ms"] is None) == (not r["verified"]) or r is base
    if "openvino" in runtimes:
        assert {"fp32", "int8"} <= {r["precision"] for r in rows if r["runtime"] == "openvino"}

    for r in rows:
        r.update(model="smallest", cpu="test cpu", integer_dot_product=False)
    doc = {"command": "c", "machine": "m", "date": "d", "note": "", "results": rows}
    text = er.markdown(er.merge(None, doc, False))
    assert "## test cpu" in text and "**pick**" in text


def test_merge_keeps_other_rows(tmp_path):
    out = tmp_path / "r.json"
    old = {"runs": [{"date": "a"}], "results": [
        {"model": "largest", "cpu": "x", "batch": 1, "threads": 8, "v": 1},
        {"model": "largest", "cpu": "y", "batch": 1, "threads": 1, "v": 1}]}
    out.write_text(json.dumps(old))
    new = {"command": "c", "machine": "m", "date": "b", "note": "",
           "results": [{"model": "largest", "cpu": "y", "batch": 1, "threads": 1, "v": 2}]}
    doc = er.merge(out, new, True)
    assert sorted((r["cpu"], r["v"]) for r in doc["results"]) == [("x", 1), ("y", 2)]
    assert [r["date"] for r in doc["runs"]] == ["a", "b"]


@pytest.mark.parametrize("argv, words", [
    (["--threads", "0"], "--threads"), (["--batches", "-1"], "--batches"),
    (["--models", "huge"], "--models"), (["--runtimes", "tvm"], "--runtimes"),
    (["--test-images", "0"], "--test-images")])
def test_bad_arguments_are_one_line_errors(argv, words, tmp_path):
    with pytest.raises(UserError, match=words):
        er.main([*argv, "--out", str(tmp_path / "r.json")])
    assert not (tmp_path / "r.json").exists()


def test_int_list_drops_repeats():
    assert er.int_list("--threads", [1, 2, 1]) == [1, 2]


def test_the_export_benchmarks_share_their_argument_checks():
    """export_ort and export_ort_ops read comma lists; all three refuse bad values alike."""
    eo = er.export_ort
    assert eo.parse_list("--batches", "1,32,1,") == [1, 32]
    for text in ("1,x", "0", ""):
        with pytest.raises(UserError, match="--batches"):
            eo.parse_list("--batches", text)
    assert eo.check_models(["smallest"]) == ["smallest"]
    with pytest.raises(UserError, match="--models: expected some of largest middle smallest"):
        eo.check_models([])
    assert eo.command_line(["--threads", "1 2"]).endswith("--threads '1 2'")


def test_a_runtime_returning_no_rows_fails_verification(files, monkeypatch):
    import hwnas.export.recommend as rec

    class Empty(Runner):
        runtime, threads, precision = "onnxruntime", 1, "f32"

        def get_inputs(self):
            return [type("A", (), {"name": "x"})()]

        def run(self, feeds):
            return [np.zeros((0, 10), np.float32)]

    fs, refs, x, y = files
    monkeypatch.setattr(rec, "make_runner", lambda *a, **k: Empty())
    cs, _, _ = rec.verify_candidates(runtime="onnxruntime", threads=1, files=fs[:1],
                                           references=refs, images=x, labels=y)
    assert not cs[0].verified and "shape [0, 10] for 48 images" in cs[0].note


@pytest.mark.skipif(not openvino_available(), reason="OpenVINO is not installed")
def test_stream_candidates_are_rows_of_the_paired_measurement(files):
    fs, refs, x, y = files
    rows = er.measure(fs[:1], refs, x, y, runtimes=["onnxruntime", "openvino"], batch=2,
                      threads=2, rounds=1, runs=1, warmup=0, cache={})
    split = [r for r in rows if r["streams"] == 2]
    assert split and all(r["runtime"] == "openvino" and r["ms"] is not None for r in split)
    assert all(r["settings"]["NUM_STREAMS"] == 2 and r["settings"]["static_batch"] == 1
               for r in split)
    assert {er.candidate_name(r) for r in split} >= {"ov fp32 x2"}
    assert all(r["streams"] == 1 for r in rows if r["runtime"] == "onnxruntime")
    for r in rows:
        r.update(model="smallest", cpu="test cpu", integer_dot_product=False)
    text = er.markdown(er.merge(None, {"command": "c", "machine": "m", "date": "d", "note": "",
                                       "results": rows}, False))
    assert "| smallest | 2 | 2 | openvino | fp32 x2 |" in text


# -- --accuracy-only: every candidate verified on the test images, no timing -------------------

def test_accuracy_rows_verify_every_candidate_without_timing(files):
    fs, refs, x, y = files
    runtimes = ["onnxruntime"] + (["openvino"] if openvino_available() else [])
    rows = er.accuracy_rows(fs, refs, x, y, runtimes=runtimes, threads=1)
    ort_rows = [r for r in rows if r["runtime"] == "onnxruntime"]
    assert [r["precision"] for r in ort_rows] == ["fp32", "int8", "int8-requant"]
    if "openvino" in runtimes:  # each file as written and under the bf16/f16 hints it runs
        assert {"fp32", "int8", "int8-requant"} <= {r["precision"] for r in rows
                                                    if r["runtime"] == "openvino"}
    float_top1 = 100.0 * float((refs["float"].argmax(1) == y).mean())
    for r in rows:
        assert "ms" not in r and r["n_images"] == len(x) and r["float_top1"] == float_top1
        if r["top1"] is None:  # the runtime could not run it
            assert not r["verified"] and r["note"].startswith("failed to run")
            continue
        assert r["drop"] == pytest.approx(float_top1 - r["top1"])
        assert r["verified"] == (r["agreement"] >= 0.99 and r["drop"] <= 0.3 + 1e-9)
    assert ort_rows[0]["agreement"] == 1.0 and ort_rows[0]["verified"]


def test_accuracy_section_beside_the_timing_tables(files, tmp_path):
    fs, refs, x, y = files
    rows = er.accuracy_rows(fs, refs, x, y, runtimes=["onnxruntime"], threads=1)
    for r in rows:
        r.update(model="smallest", arch="k3e3", cpu="cpu b", flags=["avx512_vnni"])
    out = tmp_path / "acc.json"
    out.write_text(json.dumps({"runs": [{"date": "a"}], "results": [
        dict(rows[0], cpu="cpu a"), dict(rows[0], precision="stale")]}))
    doc = {"command": "c", "machine": "m", "date": "b", "note": "", "results": rows}
    acc = er.merge(out, doc, True, ("model", "cpu"))
    assert sorted({(r["cpu"], r["precision"]) for r in acc["results"]}) == [
        ("cpu a", "fp32"), ("cpu b", "fp32"), ("cpu b", "int8"), ("cpu b", "int8-requant")]
    timing = {"runs": [], "results": [], "findings": ["kept"]}
    text = er.markdown(timing, acc)
    assert "## What the figures show" in text and "- kept" in text
    assert "## Accuracy of every file on all test images" in text
    assert text.count("### smallest (") == 2  # one table per model and CPU
    assert f"| onnxruntime | int8-requant | qdq-requant/smallest.onnx | {rows[2]['top1']:.2f} |" \
        in text
    assert "## Accuracy" not in er.markdown(timing)


def test_accuracy_only_run_writes_the_table_not_the_timings(tmp_path, monkeypatch):
    from hwnas.supernet.spaces import get_space

    torch.manual_seed(0)  # a tiny untrained mbv3 space stands in for the shipped supernet
    space = get_space("mbv3-tiny", in_channels=3, image_size=32, num_classes=10)
    monkeypatch.setattr(er.export_ort, "load_mbv3",
                        lambda ckpt: ("tiny.pt", space, space.build_supernet(), {}))
    out = tmp_path / "er.json"
    er.main(["--accuracy-only", "--models", "smallest", "--runtimes", "onnxruntime", "--data",
             "", "--test-images", "8", "--calib-images", "8", "--threads", "1",
             "--out", str(out)])
    assert not out.exists()
    doc = json.loads((tmp_path / "er_accuracy.json").read_text())
    assert [r["precision"] for r in doc["results"]] == ["fp32", "int8", "int8-requant"]
    assert all(r["model"] == "smallest" and r["n_images"] == 8 and r["top1"] is None
               for r in doc["results"])
    assert "### smallest (" in (tmp_path / "er.md").read_text()


def _row(label, ms, *, precision="fp32", rp="f32", streams=1, note="", rec=False, rounds=None,
         size=None):
    return {"label": label, "ms": ms, "precision": precision, "runtime_precision": rp,
            "streams": streams, "note": note, "recommended": rec, "verified": True,
            "round_ms": rounds, "size_bytes": size}


def test_repick_caps_the_tie_margin_on_stored_rows() -> None:
    tie = "as fast as qdq within the paired timing's noise; qdq is the smaller or simpler file"
    rows = [_row("fp32", 27.0), _row("qdq x4", 20.6, precision="int8", streams=4, rec=True),
            _row("bf16 x8", 16.3, rp="bf16", streams=8, note=tie),
            _row("bf16 x4", 17.7, rp="bf16", streams=4, note=tie),
            _row("slow", 30.0, note="not faster than FP32 overall and in both halves of the "
                                    "paired timing")]
    best = er.repick(rows)
    # int8 x4 is 21 % slower than the fastest: no longer a tie; bf16 x4 is within 10 %
    assert best["label"] == "bf16 x4" and best["recommended"] and best["note"] == ""
    assert [r["recommended"] for r in rows] == [False, False, False, True, False]
    assert rows[1]["note"] == "" and "bf16 x4" in rows[2]["note"]
    assert rows[4]["note"].startswith("not faster")
    # with per-round medians the decision is exact: the bf16 file's rounds +-8 % (the drift
    # cancels in the ratio), the int8 file 6 % slower -> a tie, the smaller file wins
    drift = np.array([1.0, 1.1, 1.2])
    rows = [_row("fp32", 27.0, rounds=list(27.0 * drift), size=400),
            _row("qdq", 17.0, precision="int8", rounds=list(17.0 * drift), size=120),
            _row("bf16", 16.0, rp="bf16", rounds=list(16.0 * drift * [1.0, 1.08, 0.92]),
                 size=400, rec=True)]
    assert er.repick(rows)["label"] == "qdq"
    rows[1]["round_ms"] = list(19.0 * drift)  # 16 % slower: more than any tie margin
    assert er.repick(rows)["label"] == "bf16"
    rows[2]["round_ms"] = list(16.0 * drift)  # 6 % with steady rounds: beyond the 3 % floor
    rows[1]["round_ms"] = list(17.0 * drift)
    assert er.repick(rows)["label"] == "bf16"
