"""Tests for ``hwnas export RUN_DIR`` (export.run_export, export.cli): a synthetic run directory
(an mbv3-tiny supernet - untrained but for a second of SGD on the quantized row's subnet -,
digits, a hand-written two-row Pareto front), the manifest, latency/ondevice.py on the export
directory, and one-line errors."""

from __future__ import annotations

import csv
import dataclasses
import json
import shutil
import sys
from pathlib import Path

import onnx
import pytest
from hwnas.export.cli import add_export_parser, run_export
from hwnas.export.model_export import ExportSettings
from hwnas.export.qdq import read_metadata
from hwnas.export.run_export import export_run
from hwnas.quant.policy import first_last_8bit, uniform

from hwnas.core.cli_args import OneLineParser
from hwnas.core.errors import UserError
from hwnas.core.written import RECORD, record_tree

FAST = ExportSettings(warmup=1, rounds=1, runs=2, profile_runs=2)
FRONT = "cpu-ort-1t"
COLUMNS = ["trial", "arch", "policy", "accuracy", "size_bytes", "bops", "flops", "params",
           "avg_weight_bits", f"latency_ms:{FRONT}", f"latency_std_ms:{FRONT}",
           "latency_ms:fpga-zcu102-est", "latency_std_ms:fpga-zcu102-est"]


def _write_front(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k, "") for k in COLUMNS})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, fitted_digits_checkpoint) -> Path:
    from hwnas.supernet.train import load_checkpoint

    run = tmp_path_factory.mktemp("run")
    shutil.copy(fitted_digits_checkpoint, run / "supernet.pt")
    space, supernet, _ = load_checkpoint(run / "supernet.pt")
    small = space.smallest()
    config = {"space": space.name, "dataset": "digits", "data_seed": 0, "seed": 0,
              "calib_batches": 2, "ptq_images": 128, "devices": [FRONT, "fpga-zcu102-est"],
              "bits": True}
    (run / "config.json").write_text(json.dumps(config))
    policy = first_last_8bit(uniform(supernet.extract(small), 4, 8))
    _write_front(run / f"pareto_{FRONT}.csv", [
        {"trial": 3, "arch": space.to_string(space.largest()), "policy": "", "accuracy": 12.5,
         f"latency_ms:{FRONT}": 0.2, "latency_ms:fpga-zcu102-est": 0.05},
        {"trial": 7, "arch": space.to_string(small), "policy": json.dumps(policy.to_dict()),
         "accuracy": 11.0, f"latency_ms:{FRONT}": 0.1, "latency_ms:fpga-zcu102-est": 0.01},
    ])
    return run


@pytest.fixture(scope="module")
def exported(run_dir: Path, tmp_path_factory):
    out = tmp_path_factory.mktemp("exports") / "export"
    lines: list[str] = []
    result = export_run(run_dir, front=FRONT, out=out, settings=FAST, progress=False,
                        report=lines.append)
    return result, out, lines


def test_export_run_writes_verified_models(exported) -> None:
    result, out, lines = exported
    assert [m.status for m in result.models] == ["ok", "ok"], [m.errors for m in result.models]
    assert [line.split(":")[0] for line in lines] == ["trial_0003", "trial_0007"]
    for rel in ("trial_0003.onnx", "trial_0007.onnx", "qdq/trial_0007.onnx",
                f"qdq-{FRONT}/trial_0007.onnx", "manifest.json", "manifest.csv"):
        assert (out / rel).is_file(), rel
    assert not (out / "qdq/trial_0003.onnx").exists()  # the float row has no quantized form
    assert not list(out.parent.glob(".export.tmp-*"))  # staging moved into place
    meta = read_metadata(onnx.load(out / f"qdq-{FRONT}/trial_0007.onnx"))
    assert meta["trial"] == 7 and meta["arch"] == result.models[1].arch
    assert meta["predicted_latency_ms"] == {FRONT: 0.1, "fpga-zcu102-est": 0.01}
    assert meta["accuracy"] == 11.0 and meta["policy"]["format"] == "hwnas-quant-policy-1"


def test_manifest_json_and_csv(exported) -> None:
    result, out, _ = exported
    doc = json.loads((out / "manifest.json").read_text())
    assert doc["failed"] == [] and doc["tuned_devices"] == {FRONT: 1}
    models = {m["name"]: m for m in doc["models"]}
    quantized = models["trial_0007"]
    files = {f["path"]: f for f in quantized["files"]}
    assert files["trial_0007.onnx"]["max_abs_diff"] <= 1e-4
    for rel in ("qdq/trial_0007.onnx", f"qdq-{FRONT}/trial_0007.onnx"):
        assert files[rel]["top1_agreement"] >= 0.99 and files[rel]["searched_agreement"] > 0
        assert files[rel]["test_accuracy"] is not None
    assert files[f"qdq-{FRONT}/trial_0007.onnx"]["float_islands"] == []
    # the default rounding: the W4 policy's files learned (AdaRound), the FP32 file none. The
    # device file keeps int8 only where int8 measured faster on this CPU (timing: on a loaded
    # machine every layer can go float), so it learned the plain file's layers it keeps int8
    plain, tuned = files["qdq/trial_0007.onnx"], files[f"qdq-{FRONT}/trial_0007.onnx"]
    assert plain["rounding"] == "adaround" and plain["adaround_layers"]
    kept = [n for n in plain["adaround_layers"] if n not in tuned["float_layers_for_speed"]]
    assert tuned["adaround_layers"] == kept
    assert tuned["rounding"] == ("adaround" if kept else "nearest")
    assert files["trial_0007.onnx"]["rounding"] == ""
    devices = {d["device"]: d for d in quantized["devices"]}
    cpu = devices[FRONT]
    assert cpu["measured"] and cpu["predicted_latency_ms"] == 0.1
    assert isinstance(cpu["quantized_faster"], bool)
    assert (cpu["recommended"] != "trial_0007.onnx") == cpu["quantized_faster"]
    assert cpu["recommended_ms"] <= cpu["fp32_ms"] and cpu["recommended"] in files
    for c in cpu["candidates"]:  # verified ones were timed, in the paired timing of the device
        assert (c["median_ms"] is not None) == c["verified"], c
        if c["verified"]:
            assert files[c["path"]]["latency_ms"][FRONT] == c["median_ms"]
    fpga = devices["fpga-zcu102-est"]
    assert not fpga["measured"] and fpga["quantized_faster"] is None
    with open(out / "manifest.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["path"] for r in rows] == ["trial_0003.onnx", "trial_0007.onnx",
                                         "qdq/trial_0007.onnx", f"qdq-{FRONT}/trial_0007.onnx"]
    assert {f"predicted_ms:{FRONT}", f"quantized_faster:{FRONT}", f"recommended:{FRONT}",
            f"latency_ms:{FRONT}", f"settings:{FRONT}", "float_islands"} <= set(rows[0])
    speedups = json.loads((out / f"int8_speedup_{FRONT}.json").read_text())
    assert speedups["int8_speedup"] and all(v > 0 for v in speedups["int8_speedup"].values())


def test_ondevice_script_consumes_the_export_directory(exported, tmp_path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "latency"))
    try:
        import ondevice
    finally:
        sys.path.pop(0)
    result, out, _ = exported
    args = ["--repeats", "3", "--warmup", "1", "--max-cv", "100", "--quiet"]
    assert ondevice.main([str(out), "--out", str(tmp_path / "fp32.csv"), *args]) == 0
    with open(tmp_path / "fp32.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted(r["arch"] for r in rows) == sorted(m.arch for m in result.models)
    assert ondevice.main([str(out / f"qdq-{FRONT}"), "--out", str(tmp_path / "q.csv"), *args]) == 0


def _cli(argv: list[str]) -> int:
    parser = OneLineParser(prog="hwnas")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    handler = add_export_parser(sub)
    assert handler is run_export
    return handler(parser.parse_args(argv))


def test_whole_command_errors_are_user_errors(run_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        _cli(["export", str(tmp_path / "missing")])
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("hello")
    with pytest.raises(UserError, match="not an hwnas run directory"):
        _cli(["export", str(tmp_path / "foreign")])
    with pytest.raises(UserError, match="no Pareto front for device 'raspi4'.*cpu-ort-1t"):
        _cli(["export", str(run_dir), "--front", "raspi4"])
    with pytest.raises(UserError, match="trial 99 is not on the selected front"):
        _cli(["export", str(run_dir), "--select", "3,99"])
    with pytest.raises(UserError, match="--select"):
        _cli(["export", str(run_dir), "--select", "best"])
    assert not (run_dir / "export").exists()  # nothing written on a whole-command error


def test_bad_rows_fail_one_line_each_and_the_good_ones_are_written(run_dir: Path, tmp_path: Path,
                                                                    capsys) -> None:
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    with open(run / f"pareto_{FRONT}.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    foreign_policy = json.loads(rows[1]["policy"])
    foreign_policy["layers"]["blocks.9.ghost_conv"] = {"w_bits": 8, "a_bits": 8}
    rows += [{**rows[1], "trial": "8", "policy": json.dumps(foreign_policy)},
             {**rows[0], "trial": "9", "arch": "k9e9_not_an_arch"}]
    _write_front(run / f"pareto_{FRONT}.csv", rows)
    out = tmp_path / "out"
    code = _cli(["export", str(run), "--out", str(out), "--select", "3,8,9", "--quiet",
                 "--max-images", "64"])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2
    assert err[0].startswith("trial_0008: failed: ") and "ghost_conv" in err[0]
    assert err[1].startswith("trial_0009: failed: ")
    assert (out / "trial_0003.onnx").is_file()
    assert not list(out.glob("trial_0008*")) and not list(out.glob("trial_0009*"))
    doc = json.loads((out / "manifest.json").read_text())
    assert doc["failed"] == ["trial_0008", "trial_0009"]


def test_parity_failure_fails_the_model(run_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """Over ``atol`` (0 here: every file is) an FP32 file passes only where it is no farther
    from the model's float64 answer than ``FLOAT32_SLACK`` times PyTorch's float32 pass, and
    says so; with no slack it fails the model and is not written."""
    import hwnas.export.verify as verify

    settings = ExportSettings(warmup=1, rounds=1, runs=2,
                              profile_runs=2, atol=0.0)
    result = export_run(run_dir, front=FRONT, select="3", out=tmp_path / "ok", settings=settings,
                        progress=False, report=lambda line: None)
    fp32 = next(f for f in result.models[0].files if f.precision == "fp32")
    assert fp32.ok and fp32.max_abs_diff > 0 and "is float32 rounding" in fp32.parity_note
    assert (tmp_path / "ok" / "trial_0003.onnx").is_file()
    monkeypatch.setattr(verify, "FLOAT32_SLACK", 0.0)
    result = export_run(run_dir, front=FRONT, select="3", out=tmp_path / "out", settings=settings,
                        progress=False, report=lambda line: None)
    model = result.models[0]
    assert model.status == "failed" and "FP32 parity failed" in model.errors[0]
    assert not (tmp_path / "out" / "trial_0003.onnx").exists()


def test_interrupted_export_leaves_the_previous_one(run_dir: Path, tmp_path: Path,
                                                    monkeypatch) -> None:
    import hwnas.export.model_export as me

    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text('{"format": "hwnas-export-manifest-1"}')
    (out / "old.onnx").write_text("previous export")
    record_tree(out, "export")  # what an export records once complete

    def boom(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise KeyboardInterrupt
    monkeypatch.setattr(me, "export_model", boom)
    with pytest.raises(KeyboardInterrupt):
        export_run(run_dir, front=FRONT, out=out, settings=FAST, progress=False)
    assert sorted(p.name for p in out.iterdir()) == [RECORD, "manifest.json", "old.onnx"]
    assert not list(tmp_path.glob(".out.*"))


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_export_never_replaces_a_directory_it_did_not_write(run_dir: Path, tmp_path: Path) -> None:
    """Data loss, issue 26.1: --out naming a user's directory or the run directory is refused
    before anything is exported, and both are left byte for byte."""
    user = tmp_path / "d"
    user.mkdir()
    (user / "thesis.txt").write_text("x")
    run_before = _tree(run_dir)
    for out, message in ((user, "not an hwnas export"), (run_dir, "is the run directory"),
                         (run_dir.parent, "is the run directory or holds it")):
        with pytest.raises(UserError, match=message):
            export_run(run_dir, select="3", out=out, settings=FAST, progress=False)
    assert _tree(user) == {"thesis.txt": b"x"}
    assert _tree(run_dir) == run_before


def test_an_earlier_export_with_a_users_file_in_it_is_refused(run_dir: Path, exported,
                                                              tmp_path: Path) -> None:
    out = tmp_path / "copy"
    shutil.copytree(exported[1], out)
    (out / "qdq" / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="holds qdq/notes.txt, which hwnas did not write"):
        export_run(run_dir, select="3", out=out, settings=FAST, progress=False)
    assert (out / "qdq" / "notes.txt").read_text() == "mine"


def test_select_specs(run_dir: Path) -> None:
    from hwnas.export.run_export import parse_select, read_front

    rows = read_front(run_dir / f"pareto_{FRONT}.csv", FRONT)
    assert [r.trial for r in parse_select("all", rows, None)] == [3, 7]
    assert [r.trial for r in parse_select("7", rows, None)] == [7]
    assert [r.trial for r in parse_select("top:1", rows, None)] == [3]
    assert [r.trial for r in parse_select("fastest:1", rows, FRONT)] == [7]
    with pytest.raises(UserError, match="needs --front"):
        parse_select("fastest:1", rows, None)
    with pytest.raises(UserError, match="positive count"):
        parse_select("top:0", rows, None)


def test_extra_openvino_device_gets_a_recommendation(run_dir: Path, tmp_path: Path) -> None:
    from hwnas.latency.onnx_measure import openvino_available

    if not openvino_available():
        pytest.skip("OpenVINO is not installed (pip install -e '.[openvino]')")
    lines: list[str] = []
    result = export_run(run_dir, front=FRONT, select="7", out=tmp_path / "out",
                        settings=dataclasses.replace(FAST, rounding="nearest"),  # spares AdaRound
                        progress=False, report=lines.append, devices=["cpu-ov-1t"])
    doc = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert doc["tuned_devices"] == {FRONT: 1, "cpu-ov-1t": 1}
    entry = {d.device: d for d in result.models[0].devices}["cpu-ov-1t"]
    assert entry.runtime == "openvino" and entry.recommended_ms <= entry.fp32_ms
    assert "INFERENCE_PRECISION_HINT" in entry.settings
    assert f"cpu-ov-1t: {entry.recommended}" in lines[0]
