"""End-to-end tests of ``hwnas latency ...`` and of the standalone on-device script.

The happy paths run in real subprocesses, as a user would run them; the many bad-input cases
run through ``hwnas.cli.main`` in-process (the same code path, minus ~4 s of interpreter and
torch start-up each), checking exit status 2, one error line and that nothing was written.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
from hwnas.supernet.spaces import get_space
from onnx import TensorProto, helper

from hwnas.cli import main

REPO = Path(__file__).resolve().parent.parent
ONDEVICE = REPO / "latency" / "ondevice.py"
SPACE = "mbv3-tiny"


def tiny_onnx(path: Path, arch: str | None, width: int = 8) -> None:
    """A float model ``relu(x @ W)`` with a dynamic batch; ``arch`` metadata when given."""
    w = helper.make_tensor("W", TensorProto.FLOAT, [4, width], np.ones(4 * width, dtype=np.float32))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "W"], ["h"]), helper.make_node("Relu", ["h"], ["logits"])],
        "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", width])],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if arch is not None:
        helper.set_model_props(model, {"arch": arch, "accuracy": "97.5"})
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())


def sample_archs(n: int, seed: int = 0) -> list[str]:
    space = get_space(SPACE)
    rng = np.random.default_rng(seed)
    out: list[str] = []
    while len(out) < n:
        s = space.to_string(space.sample(rng))
        if s not in out:
            out.append(s)
    return out


@pytest.fixture()
def models(tmp_path) -> tuple[Path, list[str]]:
    """Three tiny models with arch metadata and one without (its arch is the file stem)."""
    d = tmp_path / "models"
    d.mkdir()
    archs = sample_archs(3)
    for i, arch in enumerate(archs):
        tiny_onnx(d / f"trial_{i:04d}.onnx", arch, width=8 * (i + 1))
    tiny_onnx(d / "plain_model.onnx", None)
    (d / "notes.txt").write_text("not a model")
    return d, archs


@pytest.fixture(autouse=True)
def profile_dir(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "devices"
    monkeypatch.setenv("HWNAS_DEVICE_DIR", str(root))
    return root


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
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("hwnas") and "error:" in lines[0], lines[0]
    assert re.search(pattern, lines[0]), lines[0]


def write_measurements(path: Path, n: int = 8) -> list[str]:
    space = get_space(SPACE)
    archs = sample_archs(n, seed=1)
    ms = [space.flops(space.parse(a)) / 1e6 * 0.3 + 0.05 for a in archs]
    pd.DataFrame({"arch": archs, "latency_ms": ms}).to_csv(path, index=False)
    return archs


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


# --------------------------------------------------------------------------------------------
# the standalone on-device script
# --------------------------------------------------------------------------------------------


def test_ondevice_imports_only_the_standard_library_numpy_and_onnxruntime():
    """Module-level imports: stdlib, numpy, onnxruntime; OpenVINO only inside functions
    (imported when --runtime openvino asks for it)."""
    tree = ast.parse(ONDEVICE.read_text())
    top, lazy = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names = {(node.module or "").split(".")[0]}
        else:
            continue
        (top if node in tree.body else lazy).update(names)
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    assert top - stdlib == {"numpy", "onnxruntime"}, top - stdlib
    assert lazy - stdlib <= {"openvino"}, lazy - stdlib


def test_ondevice_runs_isolated_and_writes_the_csv(models, tmp_path):
    d, archs = models
    out = tmp_path / "measurements.csv"
    proc = subprocess.run([sys.executable, "-I", str(ONDEVICE), str(d), "--out", str(out),
                           "--repeats", "5", "--warmup", "1", "--max-cv", "100", "--quiet"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    frame = pd.read_csv(out)
    assert list(frame.columns) == ["arch", "latency_ms", "p95_ms", "cv", "file"]
    assert sorted(frame["arch"]) == sorted(archs + ["plain_model"])
    assert (frame["latency_ms"] > 0).all() and (frame["p95_ms"] >= frame["latency_ms"]).all()
    assert "wrote 4 measurements" in proc.stdout


def test_ondevice_needs_no_hwnas_package(models, tmp_path):
    """Run the script with hwnas, torch and pandas made unimportable."""
    d, _ = models
    out = tmp_path / "m.csv"
    blocker = (
        "import sys, runpy\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in {'hwnas','supernet','latency','search','quant','export','torch','pandas'}:\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        f"sys.argv = ['ondevice.py', {str(d)!r}, '--out', {str(out)!r}, '--repeats', '3',"
        " '--warmup', '0', '--max-cv', '100', '--quiet']\n"
        f"runpy.run_path({str(ONDEVICE)!r}, run_name='__main__')\n"
    )
    proc = subprocess.run([sys.executable, "-I", "-c", blocker], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(pd.read_csv(out)) == 4


def test_ondevice_refuses_unstable_and_bad_input(models, tmp_path):
    d, _ = models
    out = tmp_path / "m.csv"
    proc = subprocess.run([sys.executable, "-I", str(ONDEVICE), str(d), "--out", str(out),
                           "--repeats", "3", "--warmup", "0", "--max-cv", "1e-12", "--quiet"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and not out.exists()
    assert "all 4 models were unstable" in proc.stderr.splitlines()[-1]
    proc = subprocess.run([sys.executable, "-I", str(ONDEVICE), str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "not a directory" in proc.stderr


# --------------------------------------------------------------------------------------------
# hwnas latency measure / devices / predict / adapt, happy paths in subprocesses
# --------------------------------------------------------------------------------------------


def test_measure_writes_the_same_csv(models, tmp_path, profile_dir):
    d, archs = models
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
    write_measurements(m, 12)
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
    from hwnas.latency.cli import default_predictor

    need = default_predictor(get_space(SPACE)).min_samples
    m = tmp_path / "m.csv"
    write_measurements(m, max(need - 1, 1))
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
    write_measurements(m, 8)
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


def test_predict_and_measure_refuse_to_overwrite(capsys, tmp_path, models):
    (a,) = sample_archs(1)
    src = tmp_path / "archs.csv"
    src.write_text(f"arch\n{a}\n")
    out = tmp_path / "out.csv"
    out.write_text("keep me")
    code, _, err = run_main(capsys, "latency", "predict", "--device", "raspi4-est", "--space",
                            SPACE, "--archs", str(src), "--out", str(out))
    assert_one_error_line(code, err, "already exists; pass --overwrite")
    code, _, err = run_main(capsys, "latency", "measure", str(models[0]), "--out", str(out), "--quiet")
    assert_one_error_line(code, err, "already exists; pass --overwrite")
    assert out.read_text() == "keep me"
    code, _, _ = run_main(capsys, "latency", "predict", "--device", "raspi4-est", "--space",
                          SPACE, "--archs", str(src), "--out", str(out), "--overwrite")
    assert code == 0 and pd.read_csv(out)["arch"].tolist() == [a]


def test_measure_bad_input_and_unstable(capsys, tmp_path, models):
    d, _ = models
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


def test_measure_partial_instability_exits_1(capsys, tmp_path, models, monkeypatch):
    """Models whose cv stays above --max-cv are left out and named; the rest are written."""
    import hwnas.latency.onnx_measure as om

    real = om.measure_onnx

    def flaky(path, **kw):
        stats = real(path, **kw)
        if Path(path).name == "trial_0000.onnx":
            return om.LatencyStats(**{**stats.as_dict(), "cv": 500.0})
        return stats

    monkeypatch.setattr(om, "measure_onnx", flaky)
    d, archs = models
    out = tmp_path / "m.csv"
    code, stdout, err = run_main(capsys, "latency", "measure", str(d), "--out", str(out), "--quiet",
                                 "--repeats", "3", "--warmup", "0", "--max-cv", "100")
    assert code == 1, err
    assert "unstable: trial_0000.onnx" in err and "not reported" in err
    frame = pd.read_csv(out)
    assert archs[0] not in set(frame["arch"]) and len(frame) == 3
    assert "1 unstable models left out" in stdout


def test_measure_prints_csv_without_out(capsys, models):
    code, stdout, err = run_main(capsys, "latency", "measure", str(models[0]), "--quiet",
                                 "--repeats", "3", "--warmup", "0", "--max-cv", "100")
    assert code == 0, err
    assert stdout.splitlines()[0] == "arch,latency_ms,p95_ms,cv,file"
    assert len(stdout.splitlines()) == 5


def test_devices_unknown_space(capsys):
    code, _, err = run_main(capsys, "latency", "devices", "--space", "nospace")
    assert_one_error_line(code, err, "unknown space 'nospace'")
