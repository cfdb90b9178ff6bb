"""``hwnas latency reference`` (latency.reference) and the leave-one-out verdict of ``hwnas
latency adapt`` (latency.fewshot.leave_one_out)."""

from __future__ import annotations

import csv

import numpy as np
import onnx
import pytest
from hwnas.cli import main
from hwnas.latency import reference as ref_module
from hwnas.latency.fewshot import LOO_MAX_FOLDS, leave_one_out
from hwnas.latency.predictors import OpCountPredictor, load_pretrained
from hwnas.latency.reference import ReferenceSet, choose_reference, export_reference
from hwnas.supernet.spaces import get_space

from hwnas.core.errors import UserError


# --------------------------------------------------------------------------------------------
# choosing and exporting
# --------------------------------------------------------------------------------------------


def test_the_predictors_reference_archs_come_first():
    space = get_space("nb201")
    refs = load_pretrained("nb201").reference_archs
    chosen = choose_reference(space, 10)
    assert chosen.archs == refs[:10] and chosen.n_reference == 10 and chosen.predictor == "meta"
    more = choose_reference(space, len(refs) + 3, seed=1)
    assert more.archs[: len(refs)] == refs and more.n_reference == len(refs)
    assert len(set(more.archs)) == len(refs) + 3
    assert space.to_string(space.smallest()) in more.archs[len(refs):] or \
        space.to_string(space.smallest()) in refs
    with pytest.raises(UserError, match="integer >= 1"):
        choose_reference(space, 0)


def test_without_references_the_models_span_the_space():
    space = get_space("nb201")
    chosen = choose_reference(space, 4, predictor=OpCountPredictor(space), seed=3)
    assert chosen.n_reference == 0 and chosen.predictor == "opcount"
    assert chosen.archs[:2] == [space.to_string(space.smallest()), space.to_string(space.largest())]
    assert chosen.archs == choose_reference(space, 4, predictor=OpCountPredictor(space),
                                            seed=3).archs


def test_export_writes_models_with_their_arch_and_the_csv(tmp_path, one_torch_thread):
    from hwnas.latency.ondevice import model_arch, session_for

    space = get_space("nb201")
    chosen = choose_reference(space, 2)
    paths = export_reference(space, chosen, tmp_path / "refs")
    assert [p.name for p in paths] == ["ref_01.onnx", "ref_02.onnx"]
    for path, arch in zip(paths, chosen.archs):
        assert model_arch(session_for(path, 1), path) == arch
        props = {p.key: p.value for p in onnx.load(path).metadata_props}
        assert props["space"] == "nb201" and props["reference_order"] in ("1", "2")
    with open(tmp_path / "refs" / "archs.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["arch"] for r in rows] == chosen.archs and rows[1]["file"] == "ref_02.onnx"
    # a non-empty directory needs --overwrite; then it is replaced as a whole (the second
    # model of the larger export goes: it is one the export wrote)
    with pytest.raises(UserError, match="already holds a reference export; pass --overwrite"):
        export_reference(space, chosen, tmp_path / "refs")
    export_reference(space, ReferenceSet(chosen.archs[:1], 1, "meta"), tmp_path / "refs",
                     overwrite=True)
    assert sorted(p.name for p in (tmp_path / "refs").iterdir()) == [
        ".hwnas-written.json", "archs.csv", "ref_01.onnx"]
    # ... but never a file it did not write, even one named like its models
    for mine in ("notes.txt", "ref_07.onnx"):
        (tmp_path / "refs" / mine).write_text("mine")
        with pytest.raises(UserError, match=f"holds {mine}, which hwnas did not write"):
            export_reference(space, chosen, tmp_path / "refs", overwrite=True)
        assert (tmp_path / "refs" / mine).read_text() == "mine"
        (tmp_path / "refs" / mine).unlink()


def test_overwrite_never_deletes_a_users_folder_named_like_a_model(tmp_path, capsys,
                                                                  one_torch_thread):
    """Issue 50: a user's folder DIR/ref_99.onnx/ (thesis.txt, chapter1/draft.txt) in a
    reference export was deleted by --overwrite."""
    from fuzz_support import assert_clean_refusal

    refs = tmp_path / "refs"
    assert main(["latency", "reference", "--space", "nb201", "--n", "2", "--export",
                 str(refs)]) == 0
    (refs / "ref_99.onnx" / "chapter1").mkdir(parents=True)
    (refs / "ref_99.onnx" / "thesis.txt").write_text("years of work")
    (refs / "ref_99.onnx" / "chapter1" / "draft.txt").write_text("draft")
    assert_clean_refusal(["latency", "reference", "--space", "nb201", "--n", "2", "--export",
                          str(refs), "--overwrite"], "holds ref_99.onnx/, which hwnas did not "
                         "write", capsys, tmp_path)
    assert (refs / "ref_99.onnx" / "thesis.txt").read_text() == "years of work"


def test_a_huge_n_is_refused_at_once(tmp_path, capsys):
    """Issue 50: --n 100000 ran until killed for memory."""
    from fuzz_support import assert_clean_refusal

    assert_clean_refusal(["latency", "reference", "--space", "mbv3-tiny", "--n", "100000",
                          "--export", str(tmp_path / "refs")], "at most 1000", capsys, tmp_path)


def test_a_failed_export_leaves_nothing(tmp_path, monkeypatch, one_torch_thread):
    import hwnas.supernet.onnx as onnx_module

    space = get_space("nb201")
    real, calls = onnx_module.onnx_bytes, []

    def fail_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise UserError("boom")
        return real(*args, **kwargs)

    monkeypatch.setattr(onnx_module, "onnx_bytes", fail_second)
    with pytest.raises(UserError, match="boom"):
        export_reference(space, choose_reference(space, 3), tmp_path / "refs")
    assert list(tmp_path.iterdir()) == []
    assert ref_module.ARCHS_FILE == "archs.csv"


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, one_torch_thread):
    def no_space(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ref_module, "write_atomic", no_space)
    space = get_space("nb201")
    with pytest.raises(UserError, match="No space left on device.*nothing was written"):
        export_reference(space, choose_reference(space, 1), tmp_path / "refs")
    assert list(tmp_path.iterdir()) == []


def test_reference_cli_refuses_bad_input_in_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    for argv, message in (
        (["--space", "nb201", "--export", str(tmp_path / "file")], "is not a directory"),
        (["--space", "nb201", "--export", str(tmp_path / "no" / "dir")], "does not exist"),
        (["--space", "nb201", "--n", "0", "--export", str(tmp_path / "d")], "--n"),
        (["--space", "nospace", "--export", str(tmp_path / "d")], "nospace"),
        (["--space", "nb201", "--export", "/proc/hwnas-refs"], "cannot write in /proc"),
    ):
        try:
            code = main(["latency", "reference", *argv])
        except SystemExit as exc:  # argparse errors
            code = exc.code
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert code == 2 and len(err) == 1, err
        assert err[0].startswith("hwnas") and "error:" in err[0] and message in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


# --------------------------------------------------------------------------------------------
# leave-one-out
# --------------------------------------------------------------------------------------------


def opcount_truth(space, archs, noise, seed):
    """Latencies that a 6-parameter op-count model explains up to multiplicative noise."""
    cost = {"none": 0.0, "skip_connect": 0.05, "avg_pool_3x3": 0.2, "nor_conv_1x1": 0.5,
            "nor_conv_3x3": 1.5}
    rng = np.random.default_rng(seed)
    base = np.array([1.0 + sum(cost[op] for op in a.split("|") for op in [op.split("~")[0]]
                               if op in cost) for a in archs])
    return base * np.exp(noise * rng.standard_normal(len(archs)))


def test_loo_on_data_the_predictor_explains(nb201_sample):
    space, archs = nb201_sample(10, seed=5)
    y = opcount_truth(space, archs, 0.0, 0)
    fresh = OpCountPredictor(space)
    loo = leave_one_out(fresh, archs, y, seed=0)
    assert not fresh.is_adapted  # copies were adapted, not the caller's predictor
    assert loo.n == loo.folds == 10 and loo.n_fit == 9 and loo.n_half == 5
    assert loo.spearman > 0.95 and loo.median_rel_error < 0.02
    assert not loo.more_would_help and "not help much" in loo.reason
    assert "leave-one-out on the 10 measurements (each predicted after adapting to the other 9)" \
        in loo.summary()


def test_loo_says_more_would_help_when_the_ranking_is_poor(nb201_sample):
    space, archs = nb201_sample(12, seed=6)
    y = np.random.default_rng(1).uniform(1.0, 2.0, len(archs))  # latencies unrelated to archs
    loo = leave_one_out(OpCountPredictor(space), archs, y, seed=0)
    assert loo.more_would_help and loo.spearman < 0.9 and "would likely help" in loo.reason


def test_loo_limits(nb201_sample, monkeypatch):
    space, archs = nb201_sample(40, seed=2)
    with pytest.raises(UserError, match="at least 3 measurements"):
        leave_one_out(OpCountPredictor(space), archs[:2], [1.0, 2.0])
    with pytest.raises(UserError, match="2 architectures and 3 latencies"):
        leave_one_out(OpCountPredictor(space), archs[:2], [1.0, 2.0, 3.0])
    loo = leave_one_out(OpCountPredictor(space), archs, opcount_truth(space, archs, 0.05, 1))
    assert loo.n == 40 and loo.folds == LOO_MAX_FOLDS
    assert loo.n_fit == 40 - 40 // LOO_MAX_FOLDS
    assert f"{LOO_MAX_FOLDS}-fold cross-validation on the 40 measurements" in loo.summary()
    assert loo.spearman > 0.9


def test_adapt_prints_the_verdict(tmp_path, monkeypatch, capsys, nb201_sample):
    monkeypatch.setenv("HWNAS_DEVICE_DIR", str(tmp_path / "profiles"))
    space, archs = nb201_sample(8, seed=9)
    y = opcount_truth(space, archs, 0.02, 2)
    path = tmp_path / "m.csv"
    path.write_text("arch,latency_ms\n" + "".join(f"{a},{v}\n" for a, v in zip(archs, y)))
    assert main(["latency", "adapt", "--device", "dev", "--space", "nb201", "--predictor",
                 "opcount", "--measurements", str(path)]) == 0
    out = capsys.readouterr().out
    assert "leave-one-out on the 8 measurements" in out
    assert "more measurements would likely" in out
    assert "learning curve (measurements fitted on" in out and "expected from 20 more" in out
    import hwnas.latency.fewshot as fewshot

    monkeypatch.setattr(fewshot, "LOO_MAX_MEASUREMENTS", 5)
    assert main(["latency", "adapt", "--device", "dev3", "--space", "nb201", "--predictor",
                 "opcount", "--measurements", str(path)]) == 0
    assert "held-out check skipped: 8 measurements are more than 5" in capsys.readouterr().out
    short = tmp_path / "short.csv"
    short.write_text("arch,latency_ms\n" + "".join(f"{a},{v}\n" for a, v in zip(archs[:2], y)))
    assert main(["latency", "adapt", "--device", "dev2", "--space", "nb201", "--measurements",
                 str(short)]) == 0
    out = capsys.readouterr().out
    assert "are too few to check the predictor" in out
    assert "hwnas latency reference --space nb201 --n 2 --export DIR" in out  # random archs


def test_loo_learning_curve_and_expected_gain(nb201_sample):
    """The learning curve's points are the held-out fits on a quarter, a half and all but one
    fold of the measurements; a predictor still short of its parameters expects a gain, one
    that has them all expects none, and the line says whether measuring more pays."""
    space, archs = nb201_sample(40, seed=8)
    y = opcount_truth(space, archs, 0.0, 0)
    loo = leave_one_out(OpCountPredictor(space), archs[:12], y[:12], seed=0)
    assert [c[0] for c in loo.curve] == [3, 6, 10]  # 10-fold beyond 10: the last fits on 10
    assert loo.expected_gain() == (0.0, 0.0) or loo.expected_gain()[1] < 0.005
    assert "pays little" in loo.gain_line()
    short = leave_one_out(OpCountPredictor(space), archs[:8], y[:8], seed=0)  # fits on 4 ...
    d_err, d_rho = short.expected_gain()  # ... then 7: the curve still rises
    assert d_err <= 0 and d_rho >= 0
    assert short.median_rel_error + d_err >= 0 and short.spearman + d_rho <= 1
    assert "expected from 20 more" in short.gain_line()


def test_expected_gain_is_calibrated_on_a_device_whose_curve_is_known(nb201_sample):
    """On a synthetic device (op-count latencies with 10 % noise, the op-count predictor), the
    real change from 20 more measurements is known: adapt to n and to n + 20 and rank 400
    unmeasured architectures. The raw extrapolation of the held-out curve overshoots it (its
    Spearman is over the few measurements); the calibrated gain (``GAIN_SHRINK``) misses it by
    less, for both the Spearman and the error."""
    from hwnas.latency.fewshot import GAIN_SHRINK, spearman

    space, archs = nb201_sample(12 + 20 + 400, seed=11)
    assert GAIN_SHRINK[0] < 1 and GAIN_SHRINK[1] < 1
    raw_miss, cal_miss = np.zeros(2), np.zeros(2)
    for seed in range(4):
        y = opcount_truth(space, archs, 0.1, seed)
        q, yq = archs[32:], y[32:]
        loo = leave_one_out(OpCountPredictor(space), archs[:12], y[:12], seed=seed)
        real = []
        for k in (12, 32):
            p = OpCountPredictor(space).adapt(archs[:k], y[:k], seed=0).predict(q)
            real.append(np.array([np.median(np.abs(p - yq) / yq), spearman(p, yq)]))
        actual = real[1] - real[0]
        raw, cal = np.array(loo.expected_gain(shrink=(1.0, 1.0))), np.array(loo.expected_gain())
        assert (np.abs(cal) <= np.abs(raw) + 1e-12).all()  # scaled down (before the clips)
        raw_miss += np.abs(raw - actual)
        cal_miss += np.abs(cal - actual)
    assert (cal_miss < raw_miss).all(), (cal_miss, raw_miss)
    assert "an estimate" in loo.gain_line() and "typically missed" in loo.gain_line()


def test_a_reference_start_is_shrunk_more(nb201_sample):
    """Measurements that start with the predictor's reference architectures get the reference
    calibration (their curve is steeper than what 20 random ones more bring)."""
    from hwnas.latency.fewshot import GAIN_SHRINK, GAIN_SHRINK_REFERENCE

    space, archs = nb201_sample(14, seed=12)
    y = opcount_truth(space, archs, 0.1, 3)

    class WithReferences(OpCountPredictor):
        reference_archs = archs[2:12]

    assert not leave_one_out(OpCountPredictor(space), archs, y, seed=0).reference_start
    loo = leave_one_out(WithReferences(space), archs, y, seed=0)
    assert loo.reference_start
    assert not leave_one_out(WithReferences(space), archs[3:], y[3:], seed=0).reference_start
    assert loo.expected_gain() == loo.expected_gain(shrink=GAIN_SHRINK_REFERENCE)
    plain = leave_one_out(OpCountPredictor(space), archs, y, seed=0)
    assert plain.expected_gain() == plain.expected_gain(shrink=GAIN_SHRINK)
    assert GAIN_SHRINK_REFERENCE[0] < GAIN_SHRINK[0] and GAIN_SHRINK_REFERENCE[1] < GAIN_SHRINK[1]
