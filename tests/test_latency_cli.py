"""End-to-end tests of ``hwnas latency ...``.

The happy paths run in real subprocesses, as a user would run them; the many bad-input cases
run through ``hwnas.cli.main`` in-process (the same code path, minus ~4 s of interpreter and
torch start-up each), checking exit status 2, one error line and that nothing was written.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hwnas.supernet.spaces import get_space
from latency_support import SPACE, sample_archs, write_measurements

from hwnas.cli import main

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.usefixtures("profile_dir")  # never the user's device profiles


def hwnas(*args: str, env_dir: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HWNAS_DEVICE_DIR=str(env_dir))
    return subprocess.run([sys.executable, "-m", "hwnas.cli", *args], capture_output=True,
                          text=True, timeout=300, cwd=REPO, env=env)


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_error_line(code: int, err: str, pattern: str) -> None:
    assert code == 2, err
    # the busy-machine warning is about the machine the test runs on (a loaded CI runner), not
    # about the input: it may precede the error line
    lines = [ln for ln in err.splitlines()
             if ln.strip() and not ln.startswith("hwnas: warning: timed on a busy machine")]
    assert len(lines) == 1, err
    assert lines[0].startswith("hwnas") and "error:" in lines[0], lines[0]
    assert re.search(pattern, lines[0]), lines[0]


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


# --------------------------------------------------------------------------------------------
# hwnas latency measure / devices / predict / adapt, happy paths in subprocesses
# --------------------------------------------------------------------------------------------


def test_measure_writes_the_same_csv(onnx_models, tmp_path, profile_dir):
    d, archs = onnx_models
    out = tmp_path / "m.csv"
    proc = hwnas("latency", "measure", str(d), "--out", str(out), "--repeats", "5", "--warmup",
                 "1", "--max-cv", "100", "--quiet", env_dir=profile_dir)
    assert proc.returncode == 0, proc.stderr
    frame = pd.read_csv(out)
    assert list(frame.columns) == ["arch", "latency_ms", "p95_ms", "cv", "file"]
    assert dict(zip(frame["file"], frame["arch"]))["trial_0001.onnx"] == archs[1]
    assert "plain_model" in set(frame["arch"])
    assert (frame["latency_ms"] > 0).all()


def test_devices_and_predict(tmp_path, profile_dir):
    proc = hwnas("latency", "devices", "--space", SPACE, env_dir=profile_dir)
    assert proc.returncode == 0, proc.stderr
    kinds = {line.split()[0]: line.split()[1] for line in proc.stdout.splitlines()[1:]}
    assert kinds["cpu-ort-1t"] == "measured" and kinds["fpga-zcu102-est"] == "estimated"
    assert "pixel3" not in kinds  # table devices are for nb201/fbnet only

    archs = sample_archs(6)
    src = tmp_path / "archs.csv"
    pd.DataFrame({"arch": archs, "note": range(6)}).to_csv(src, index=False)
    out = tmp_path / "pred.csv"
    proc = hwnas("latency", "predict", "--device", "jetson-orin-nano-est", "--space", SPACE,
                 "--archs", str(src), "--out", str(out), env_dir=profile_dir)
    assert proc.returncode == 0, proc.stderr
    pred = pd.read_csv(out)
    assert list(pred["arch"]) == archs and (pred["latency_ms"] > 0).all()


def test_adapt_then_predict_with_the_profile(capsys, tmp_path, profile_dir):
    pytest.importorskip("hwnas.latency.predictors", reason="hwnas.latency.predictors not present yet")
    m = tmp_path / "m.csv"
    write_measurements(m, 12, seed=1)
    proc = hwnas("latency", "adapt", "--device", "my-pi", "--space", SPACE, "--measurements",
                 str(m), env_dir=profile_dir)
    assert proc.returncode == 0, proc.stderr
    assert (profile_dir / "my-pi" / "profile.json").is_file()
    src = tmp_path / "archs.csv"
    pd.DataFrame({"arch": sample_archs(5, seed=7)}).to_csv(src, index=False)
    out = tmp_path / "pred.csv"
    proc = hwnas("latency", "predict", "--device", "my-pi", "--space", SPACE, "--archs", str(src),
                 "--out", str(out), env_dir=profile_dir)
    assert proc.returncode == 0, proc.stderr
    assert (pd.read_csv(out)["latency_ms"] > 0).all()
    code, stdout, _ = run_main(capsys, "latency", "devices")
    assert code == 0
    assert any(line.split()[:2] == ["my-pi", "adapted"] for line in stdout.splitlines())


def test_bad_measurements_in_a_subprocess(tmp_path, profile_dir):
    a, b = sample_archs(2)
    m = tmp_path / "m.csv"
    m.write_text(f"arch,latency_ms\n{a},1.5\n{b},nan\n")
    proc = hwnas("latency", "adapt", "--device", "my-pi", "--space", SPACE, "--measurements",
                 str(m), env_dir=profile_dir)
    assert_one_error_line(proc.returncode, proc.stderr, "line 3: latency_ms is nan")
    assert files_under(profile_dir) == []


# --------------------------------------------------------------------------------------------
# bad input, in-process: exit 2, one line, nothing written
# --------------------------------------------------------------------------------------------

BAD_MEASUREMENTS = [
    ("arch,ms\n{a},1\n", r"lacks column\(s\) latency_ms"),
    ("latency_ms\n1\n", r"lacks column\(s\) arch"),
    ("arch,latency_ms\n{a},1\n{b},NaN\n", "line 3: latency_ms is NaN"),
    ("arch,latency_ms\n{a},0\n", "line 2: latency_ms is 0"),
    ("arch,latency_ms\n{a},-1\n", "line 2: latency_ms is -1"),
    ("arch,latency_ms\n{a},1\n{a},2\n", "line 3: architecture .* repeats line 2"),
    ("arch,latency_ms\n{a},1\nk3e4_nonsense,2\n", "line 3: architecture 'k3e4_nonsense' is not in space"),
    ("arch,latency_ms\n", "has a header but no rows"),
]


@pytest.mark.parametrize(("text", "pattern"), BAD_MEASUREMENTS)
def test_adapt_bad_measurements(capsys, tmp_path, profile_dir, text, pattern):
    a, b = sample_archs(2)
    m = tmp_path / "m.csv"
    m.write_text(text.format(a=a, b=b))
    code, _, err = run_main(capsys, "latency", "adapt", "--device", "dev1", "--space", SPACE,
                            "--measurements", str(m))
    assert_one_error_line(code, err, pattern)
    assert files_under(profile_dir) == []


def test_adapt_too_few_rows(capsys, tmp_path, profile_dir):
    pytest.importorskip("hwnas.latency.predictors", reason="hwnas.latency.predictors not present yet")
    from hwnas.latency.predictors import default_predictor

    need = default_predictor(get_space(SPACE)).min_samples
    m = tmp_path / "m.csv"
    write_measurements(m, max(need - 1, 1), seed=1)
    code, _, err = run_main(capsys, "latency", "adapt", "--device", "dev1", "--space", SPACE,
                            "--measurements", str(m))
    assert_one_error_line(code, err, "needs at least")
    assert files_under(profile_dir) == []


@pytest.mark.parametrize(("args", "pattern"), [
    (["--device", "dev1", "--space", "nospace"], "unknown space 'nospace'"),
    (["--device", "edgetpu-est", "--space", SPACE], "is a built-in device"),
    (["--device", "../evil", "--space", SPACE], "not a valid profile name"),
    (["--device", "dev1", "--space", SPACE, "--measurements", "/no/such.csv"], "does not exist"),
])
def test_adapt_bad_arguments(capsys, tmp_path, profile_dir, args, pattern):
    m = tmp_path / "m.csv"
    write_measurements(m, 8, seed=1)
    full = ["latency", "adapt", *args] + ([] if "--measurements" in args else ["--measurements", str(m)])
    code, _, err = run_main(capsys, *full)
    assert_one_error_line(code, err, pattern)
    assert files_under(profile_dir) == []


@pytest.mark.parametrize(("device", "space", "rows", "pattern"), [
    ("no-such-device", SPACE, None, "unknown device 'no-such-device'"),
    ("raspi4-est", "nospace", None, "unknown space 'nospace'"),
    ("raspi4-est", SPACE, "arch\n{a}\nnot_an_arch\n", "line 3: architecture 'not_an_arch'"),
    ("raspi4-est", SPACE, "name\n{a}\n", "no 'arch' column"),
    ("raspi4-est", SPACE, "arch\n", "has a header but no rows"),
])
def test_predict_bad_input(capsys, tmp_path, device, space, rows, pattern):
    (a,) = sample_archs(1)
    src = tmp_path / "archs.csv"
    src.write_text(rows.format(a=a) if rows else f"arch\n{a}\n")
    out = tmp_path / "out.csv"
    code, _, err = run_main(capsys, "latency", "predict", "--device", device, "--space", space,
                            "--archs", str(src), "--out", str(out))
    assert_one_error_line(code, err, pattern)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["archs.csv"]


def test_predict_table_device_needs_its_space(capsys, tmp_path):
    from hwnas.latency.devices import latency_tables

    if "nb201" not in latency_tables():
        pytest.skip("shared latency tables absent")
    (a,) = sample_archs(1)
    src = tmp_path / "archs.csv"
    src.write_text(f"arch\n{a}\n")
    code, _, err = run_main(capsys, "latency", "predict", "--device", "pixel3", "--space", SPACE,
                            "--archs", str(src), "--out", str(tmp_path / "o.csv"))
    assert_one_error_line(code, err, "has no latency for space 'mbv3-tiny'")
    assert not (tmp_path / "o.csv").exists()


def test_predict_and_measure_refuse_to_overwrite(capsys, tmp_path, onnx_models):
    (a,) = sample_archs(1)
    src = tmp_path / "archs.csv"
    src.write_text(f"arch\n{a}\n")
    out = tmp_path / "out.csv"
    out.write_text("keep me")
    code, _, err = run_main(capsys, "latency", "predict", "--device", "raspi4-est", "--space",
                            SPACE, "--archs", str(src), "--out", str(out))
    assert_one_error_line(code, err, "already exists; pass --overwrite")
    code, _, err = run_main(capsys, "latency", "measure", str(onnx_models[0]), "--out", str(out), "--quiet")
    assert_one_error_line(code, err, "already exists; pass --overwrite")
    assert out.read_text() == "keep me"
    code, _, _ = run_main(capsys, "latency", "predict", "--device", "raspi4-est", "--space",
                          SPACE, "--archs", str(src), "--out", str(out), "--overwrite")
    assert code == 0 and pd.read_csv(out)["arch"].tolist() == [a]


def test_measure_bad_input_and_unstable(capsys, tmp_path, onnx_models):
    d, _ = onnx_models
    out = tmp_path / "m.csv"
    code, _, err = run_main(capsys, "latency", "measure", str(tmp_path / "nope"), "--out", str(out))
    assert_one_error_line(code, err, "is not a directory")
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run_main(capsys, "latency", "measure", str(empty), "--out", str(out))
    assert_one_error_line(code, err, "holds no .onnx files")
    code, _, err = run_main(capsys, "latency", "measure", str(d), "--out", str(out), "--max-cv", "0")
    assert_one_error_line(code, err, "--max-cv")
    (d / "broken.onnx").write_bytes(b"not onnx")
    code, _, err = run_main(capsys, "latency", "measure", str(d), "--out", str(out), "--quiet")
    assert_one_error_line(code, err, "cannot load")
    (d / "broken.onnx").unlink()
    code, _, err = run_main(capsys, "latency", "measure", str(d), "--out", str(out), "--quiet",
                            "--repeats", "3", "--warmup", "0", "--max-cv", "1e-12")
    assert_one_error_line(code, err, "all 4 models were unstable")
    assert not out.exists()


def test_measure_partial_instability_exits_1(capsys, tmp_path, onnx_models, monkeypatch):
    """Models whose cv stays above --max-cv are left out and named; the rest are written."""
    import hwnas.latency.onnx_measure as om

    real = om.measure_onnx

    def flaky(path, **kw):
        stats = real(path, **kw)
        if Path(path).name == "trial_0000.onnx":
            return om.LatencyStats(**{**stats.as_dict(), "cv": 500.0})
        return stats

    monkeypatch.setattr(om, "measure_onnx", flaky)
    d, archs = onnx_models
    out = tmp_path / "m.csv"
    code, stdout, err = run_main(capsys, "latency", "measure", str(d), "--out", str(out), "--quiet",
                                 "--repeats", "3", "--warmup", "0", "--max-cv", "100")
    assert code == 1, err
    assert "unstable: trial_0000.onnx" in err and "not reported" in err
    frame = pd.read_csv(out)
    assert archs[0] not in set(frame["arch"]) and len(frame) == 3
    assert "1 unstable models left out" in stdout


def test_measure_warns_when_the_machine_was_busy(capsys, tmp_path, onnx_models, monkeypatch):
    """Measurements taken while other work competed for the cores are written, with a warning
    that they may not hold on a quiet machine; on a quiet one nothing is said."""
    import hwnas.latency.cli as lc

    args = ["latency", "measure", str(onnx_models[0]), "--quiet", "--repeats", "3", "--warmup",
            "0", "--max-cv", "100", "--threads", "2"]
    monkeypatch.setattr(lc, "busy_machine", lambda threads: f"busy at {threads} thread(s)")
    code, _, err = run_main(capsys, *args, "--out", str(tmp_path / "busy.csv"))
    assert code == 0 and "hwnas: warning: busy at 2 thread(s)" in err
    assert len(pd.read_csv(tmp_path / "busy.csv")) == 4
    monkeypatch.setattr(lc, "busy_machine", lambda threads: "")
    code, _, err = run_main(capsys, *args, "--out", str(tmp_path / "quiet.csv"))
    assert code == 0 and "warning" not in err


def test_measure_prints_csv_without_out(capsys, onnx_models):
    code, stdout, err = run_main(capsys, "latency", "measure", str(onnx_models[0]), "--quiet",
                                 "--repeats", "3", "--warmup", "0", "--max-cv", "100")
    assert code == 0, err
    assert stdout.splitlines()[0] == "arch,latency_ms,p95_ms,cv,file"
    assert len(stdout.splitlines()) == 5


def test_devices_unknown_space(capsys):
    code, _, err = run_main(capsys, "latency", "devices", "--space", "nospace")
    assert_one_error_line(code, err, "unknown space 'nospace'")


def test_adapt_names_and_exports_the_architectures_that_settle_the_execution_variant(
        capsys, tmp_path, profile_dir):
    """Ten measured cells without dead operations run alike whether or not the device drops
    them, so they leave that open: ``adapt`` says so, names 3 architectures that would settle
    it and, with ``--export-settling``, writes their models as ``reference --export`` does."""
    import numpy as np
    from hwnas.latency.predictors.features import executed

    space = get_space("nb201")
    rng = np.random.default_rng(3)
    alike = []
    while len(alike) < 10:
        a = space.to_string(space.sample(rng))
        ran, dead = executed(space, [a], "pruned")
        if ran[0] == a and not dead[0] and a not in alike:
            alike.append(a)
    m = tmp_path / "m.csv"
    pd.DataFrame({"arch": alike, "latency_ms": 1.0 + rng.uniform(0, 1, 10)}).to_csv(m, index=False)
    out = tmp_path / "settle"
    code, stdout, err = run_main(capsys, "latency", "adapt", "--device", "dev1", "--space", "nb201",
                                 "--measurements", str(m), "--export-settling", str(out))
    assert code == 0, err
    assert "do not settle which network the device runs" in stdout
    named = re.findall(r"^  (\|.*\|)$", stdout, flags=re.M)
    assert len(named) == 3 and not set(named) & set(alike)
    assert sorted(p.name for p in out.iterdir()) == [".hwnas-written.json", "archs.csv",
                                                      "ref_01.onnx", "ref_02.onnx", "ref_03.onnx"]
    assert list(pd.read_csv(out / "archs.csv")["arch"]) == named


def test_adapt_refuses_a_bad_settling_export_before_adapting(capsys, tmp_path, profile_dir):
    m = tmp_path / "m.csv"
    write_measurements(m, 8, seed=1)
    target = tmp_path / "taken.txt"
    target.write_text("x")
    code, _, err = run_main(capsys, "latency", "adapt", "--device", "dev1", "--space", SPACE,
                            "--measurements", str(m), "--export-settling", str(target))
    assert_one_error_line(code, err, "exists and is not a directory")
    assert files_under(profile_dir) == []
