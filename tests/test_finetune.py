"""``hwnas finetune RUN --trial N`` and ``Run.finetune``: a chosen trial fine-tuned by
distillation from the largest subnet (QAT under its policy), saved as a weights-only checkpoint
and exported again; bad input refused in one line with nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from hwnas.export.finetune import FINETUNE_FORMAT, FinetuneSettings, load_finetuned
from hwnas.export.model_export import ExportSettings
from hwnas.quant.fake_quant import quant_layers

import hwnas
from hwnas.cli import main

FAST = ExportSettings(warmup=1, rounds=1, runs=2, profile_runs=2)


@pytest.fixture(scope="module")
def run_copy(small_run: Path, tmp_path_factory) -> Path:
    """A copy of the shared small run (fine-tuning writes into its run directory)."""
    return Path(shutil.copytree(small_run, tmp_path_factory.mktemp("ft") / "run"))


def _smallest(run_dir: Path, quantized: bool) -> int:
    trials = hwnas.load_run(run_dir).trials
    rows = trials[(trials["policy"] != "") == quantized]
    return int(rows.sort_values(["flops", "trial"]).iloc[0]["trial"])


@pytest.fixture(scope="module")
def float_done(run_copy: Path, one_torch_thread):
    trial = _smallest(run_copy, quantized=False)
    code = main(["finetune", str(run_copy), "--trial", str(trial), "--epochs", "1", "--quiet"])
    return trial, code, run_copy / "finetune" / f"trial_{trial:04d}"


def test_float_trial_fine_tuned_saved_and_exported(float_done, capsys) -> None:
    trial, code, out = float_done
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["format"] == FINETUNE_FORMAT and summary["trial"] == trial
    assert summary["policy"] is None and summary["epochs"] == 1 and summary["device"] == "cpu"
    before, after = summary["before"], summary["after"]
    assert 0 < before["val"] <= after["val"] <= 100 and 0 < after["test"] <= 100
    assert [h["epoch"] for h in summary["history"]] == [0, 1]
    # the start is the model the search scored
    trials = hwnas.load_run(out.parents[1]).trials.set_index("trial")
    assert before["val"] == pytest.approx(trials.loc[trial, "accuracy"], abs=1e-9)
    assert summary["export"]["status"] == "ok"
    # the checkpoint is plain data: the weights-only loader reads it
    payload = torch.load(out / "model.pt", map_location="cpu", weights_only=True)
    assert payload["format"] == FINETUNE_FORMAT and payload["policy"] is None
    assert json.loads(payload["metadata"])["after"] == after
    model, _ = load_finetuned(out / "model.pt")
    assert not quant_layers(model)
    # the ONNX file computes what the fine-tuned model computes
    import onnxruntime as ort

    proto = onnx.load(out / f"trial_{trial:04d}.onnx")
    meta = {p.key: p.value for p in proto.metadata_props}
    assert json.loads(meta["finetuned"])["after"] == after
    x = torch.randn(16, 1, 8, 8)  # digits: 8x8 grey images
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)
    # once written, the output is replaced only with --overwrite
    capsys.readouterr()
    again = main(["finetune", str(out.parents[1]), "--trial", str(trial), "--epochs", "1",
                  "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert again == 2 and len(err) == 1 and "--overwrite" in err[0]


def test_trial_with_policy_exports_the_qat_model(run_copy: Path, tmp_path: Path,
                                                 one_torch_thread) -> None:
    trial = _smallest(run_copy, quantized=True)
    run = hwnas.load_run(run_copy)
    out = tmp_path / "ft"
    result = run.finetune(trial, epochs=1, out=out, progress=False, export_settings=FAST)
    assert result.policy is not None and result.after["val"] >= result.before["val"]
    assert result.before["val"] == pytest.approx(run.row(trial)["accuracy"], abs=1e-9)
    assert result.export.status == "ok", result.export.errors
    qdq = {f.path: f for f in result.export.files}[f"qdq/trial_{trial:04d}.onnx"]
    assert qdq.status == "ok" and qdq.top1_agreement >= 0.99
    assert (out / qdq.path).is_file() and (out / f"trial_{trial:04d}.onnx").is_file()
    # the checkpoint comes back as the QAT model, and the QDQ file agrees with it
    model, payload = load_finetuned(out / "model.pt")
    assert quant_layers(model) and payload["policy"] == result.policy
    import onnxruntime as ort

    x = torch.randn(64, 1, 8, 8)
    session = ort.InferenceSession(str(out / qdq.path), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        want = model(x).numpy()
    assert np.mean(got.argmax(1) == want.argmax(1)) >= 0.9


def _one_error(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("hwnas: error: "), err
    return err[0]


def test_bad_input_is_one_line_and_writes_nothing(small_run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    base = ["finetune", str(small_run), "--epochs", "1", "--quiet", "--out", str(out)]
    assert "no completed trial 99" in _one_error(capsys, base + ["--trial", "99"])
    assert "needs --trial N" in _one_error(capsys, base)
    assert "does not exist" in _one_error(
        capsys, ["finetune", str(tmp_path / "nope"), "--trial", "0", "--out", str(out)])
    if not torch.cuda.is_available():
        assert "CUDA is not available" in _one_error(capsys, base + ["--trial", "0",
                                                                     "--device", "cuda"])
    # a trial the trials table holds without a model
    broken = Path(shutil.copytree(small_run, tmp_path / "broken"))
    import pandas as pd

    trials = pd.read_parquet(broken / "trials.parquet")
    trials.loc[trials["trial"] == 0, "arch"] = ""
    trials.to_parquet(broken / "trials.parquet")
    assert "trial 0 of" in _one_error(capsys, ["finetune", str(broken), "--trial", "0",
                                               "--out", str(out)])
    # a directory hwnas did not write is never replaced, --overwrite or not
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert "is not a fine-tuned model" in _one_error(
        capsys, ["finetune", str(small_run), "--trial", "0", "--out", str(mine), "--overwrite"])
    assert (mine / "notes.txt").read_text() == "keep" and list(mine.iterdir()) == [mine / "notes.txt"]
    assert not out.exists() and not (small_run / "finetune").exists()
    assert not list(tmp_path.glob(".*"))


def test_settings_and_checkpoints_are_checked(tmp_path: Path) -> None:
    from hwnas.core.errors import UserError

    for bad in ({"epochs": 0}, {"lr": -1.0}, {"batch_size": 1.5}, {"temperature": 0.0},
                {"kd_weight": 0.0, "label_weight": 0.0}):
        with pytest.raises(UserError):
            FinetuneSettings(**bad).validate()
    with pytest.raises(UserError, match="does not exist"):
        load_finetuned(tmp_path / "model.pt")
    torch.save({"format": "other"}, tmp_path / "other.pt")
    with pytest.raises(UserError, match="not a fine-tuned model"):
        load_finetuned(tmp_path / "other.pt")
    torch.save({"format": FINETUNE_FORMAT, "code": ExportSettings()}, tmp_path / "code.pt")
    with pytest.raises(UserError, match="never loads"):
        load_finetuned(tmp_path / "code.pt")


def test_only_an_earlier_fine_tuning_is_replaced(tmp_path: Path) -> None:
    from hwnas.export.finetune import WRITER, _check_replaceable

    from hwnas.core.errors import UserError
    from hwnas.core.written import record_tree

    run, out = tmp_path / "run", tmp_path / "run" / "finetune" / "trial_0001"
    out.mkdir(parents=True)
    _check_replaceable(out, run, overwrite=False)  # empty: fine
    (out / "qdq").mkdir()
    (out / "summary.json").write_text(json.dumps({"format": FINETUNE_FORMAT}))
    for name in ("model.pt", "trial_0001.onnx", "qdq/trial_0001.onnx"):
        (out / name).write_bytes(b"x")
    with pytest.raises(UserError, match="no record of files hwnas wrote"):  # files alone: no
        _check_replaceable(out, run, overwrite=True)
    record_tree(out, WRITER)  # what finetune records once its output is complete
    with pytest.raises(UserError, match="--overwrite"):
        _check_replaceable(out, run, overwrite=False)
    _check_replaceable(out, run, overwrite=True)
    (out / "qdq" / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="holds qdq/notes.txt"):
        _check_replaceable(out, run, overwrite=True)
    with pytest.raises(UserError, match="run directory"):
        _check_replaceable(run, run, overwrite=True)


def test_qdq_builder_takes_the_given_quantized_model(one_torch_thread) -> None:
    """build_qdq(quantized=...) writes the scales of the model given (as QAT learned them), not
    those of a fresh PTQ; float_layers make layers float in a copy; another policy is refused."""
    from hwnas.export.onnx_export import check_parity
    from hwnas.export.qdq import build_qdq, dequantized_twin
    from hwnas.quant.policy import uniform
    from hwnas.quant.ptq import ptq
    from hwnas.supernet.spaces import get_space

    from hwnas.core.errors import UserError

    torch.manual_seed(0)
    space = get_space("mbv3-tiny", in_channels=1, image_size=8, num_classes=10)
    model = space.build_supernet().extract(space.smallest()).eval()
    calib = [torch.randn(32, 1, 8, 8)]
    policy = uniform(model, 8, 8)
    qmodel = ptq(model, policy, calib)
    layer = dict(quant_layers(qmodel))["stem_conv"]
    with torch.no_grad():  # as if QAT had moved the step sizes
        layer.weight_quant.scale.mul_(1.5)
        layer.input_quant.scale.mul_(1.25)
    twin = dequantized_twin(qmodel)
    # the full int8 grid, as QAT learned it (the portable default moves it to 7 bits at the
    # same clipping range: tests/test_export_int8_portable.py)
    build = build_qdq(twin, policy, calib, quantized=qmodel, portable=False)
    np.testing.assert_allclose(build.layers["stem_conv"].weight_scale,
                               layer.weight_quant.scale.detach().numpy().reshape(-1), rtol=1e-6)
    assert build.layers["stem_conv"].act_scale == pytest.approx(float(layer.input_quant.scale))
    parity = check_parity(build.proto(requantize=False).SerializeToString(), qmodel,
                          torch.randn(64, 1, 8, 8), atol=float("inf"))
    assert parity.top1_agreement >= 0.95
    kept = build_qdq(twin, policy, calib, quantized=qmodel, float_layers=["stem_conv"])
    assert kept.layers["stem_conv"].category == "float" and layer.w_bits == 8  # a copy changed
    with pytest.raises(UserError, match="another policy"):
        build_qdq(twin, uniform(model, 4, 8), calib, quantized=qmodel)


def test_learning_rate_defaults_to_the_space_s() -> None:
    """Left unset, the rate is the space's (vit fine-tunes at a tenth of the convolutional
    spaces' rate); a rate the caller gives wins; QAT is never configured without one."""
    from hwnas.core.errors import UserError
    from hwnas.export.finetune import DEFAULT_LR
    from hwnas.supernet.spaces import get_space

    unset = FinetuneSettings()
    unset.validate()
    assert unset.lr is None
    assert unset.for_space(get_space("vit")).lr == pytest.approx(3e-4)
    assert unset.for_space(get_space("mbv3")).lr == DEFAULT_LR
    assert FinetuneSettings(lr=0.01).for_space(get_space("vit")).lr == 0.01
    with pytest.raises(UserError, match="without lr"):
        unset.qat_config(0, amp=False)
    assert unset.for_space(get_space("vit")).qat_config(0, amp=False).lr == pytest.approx(3e-4)
