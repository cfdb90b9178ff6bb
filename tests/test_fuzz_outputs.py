"""Fuzz suite, exports and latency files: bad export targets and selections, broken
measurement CSVs, latency outputs that cannot be written, ONNX files that cannot be measured,
each end in one error line, exit status 2, no traceback, nothing written
(tests/fuzz_support.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fuzz_support import assert_clean_refusal

from hwnas.cli import main


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, fuzz_checkpoint) -> Path:
    """A finished two-trial search (float models, one device)."""
    out = tmp_path_factory.mktemp("fuzz-run")
    assert main(["search", "--supernet", str(fuzz_checkpoint), "--devices", "edgetpu-est",
                 "--no-bits", "--objectives", "accuracy,size", "--trials", "2", "--quiet",
                 "--out", str(out), "--name", "r"]) == 0
    return out / "r"


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("mine\n")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.txt").write_text("years of work\n")
    return tmp_path


EXPORTS = [
    (["--out", "/proc/x"], "cannot write in /proc"),
    (["--out", "a_file"], "is not a directory"),
    (["--out", "mine"], "not an hwnas export"),
    (["--out", "{run}"], "is the run directory"),
    (["--out", "{run}/.."], "is the run directory or holds it"),
    (["--front", "toaster"], "no Pareto front for device 'toaster'"),
    (["--select", "top:0"], "expected a positive count"),
    (["--select", "banana"], "--select"),
    (["--batch", "0"], "expected a positive integer"),
]


@pytest.mark.parametrize("extra, message", EXPORTS, ids=[" ".join(c[0]) for c in EXPORTS])
def test_bad_exports(extra, message, workdir, run_dir, capsys):
    extra = [e.replace("{run}", str(run_dir)) for e in extra]
    assert_clean_refusal(["export", str(run_dir), "--quiet", *extra], message, capsys,
                         workdir, run_dir)


def test_export_of_what_is_not_a_run(workdir, capsys):
    assert_clean_refusal(["export", "mine", "--quiet"], "not an hwnas run directory", capsys,
                         workdir)
    assert_clean_refusal(["export", "nope", "--quiet"], "does not exist", capsys, workdir)


def _nb201_arch(i: int = 0) -> str:
    from hwnas.supernet.spaces import get_space

    space = get_space("nb201")
    return space.to_string(space.largest() if i == 0 else space.smallest())


MEASUREMENTS = {
    "huge-latency": ("arch,latency_ms\n{a},1e300\n", "not a plausible latency"),
    "tiny-latency": ("arch,latency_ms\n{a},1e-12\n", "not a plausible latency"),
    "zero": ("arch,latency_ms\n{a},0\n", "ms > 0"),
    "negative": ("arch,latency_ms\n{a},-1\n", "ms > 0"),
    "nan": ("arch,latency_ms\n{a},nan\n", "finite"),
    "text": ("arch,latency_ms\n{a},fast\n", "is not a number"),
    "empty-value": ("arch,latency_ms\n{a},\n", "is empty"),
    "repeat": ("arch,latency_ms\n{a},1\n{a},2\n", "repeats line 2"),
    "unknown-arch": ("arch,latency_ms\nnot-an-arch,1\n", "is not in space nb201"),
    "no-rows": ("arch,latency_ms\n", "no rows"),
    "empty-file": ("", "is empty"),
    "missing-column": ("arch,ms\n{a},1\n", "lacks column(s) latency_ms"),
    "ragged": ("arch,latency_ms\n{a},1,2\n", "fields"),
}


@pytest.mark.parametrize("case", list(MEASUREMENTS))
def test_bad_measurement_files(case, workdir, capsys, monkeypatch):
    monkeypatch.setenv("HWNAS_DEVICE_DIR", str(workdir / "devices"))
    text, message = MEASUREMENTS[case]
    (workdir / "m.csv").write_text(text.replace("{a}", _nb201_arch()))
    assert_clean_refusal(["latency", "adapt", "--device", "mine", "--space", "nb201",
                          "--measurements", "m.csv"], message, capsys, workdir)


def _huge_onnx(d: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    shape = ["N", 1, 100000, 100000]
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    (d / "models").mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              d / "models" / "m.onnx")
    return d / "models"


def _corrupt_onnx(d: Path) -> Path:
    (d / "models").mkdir()
    (d / "models" / "m.onnx").write_bytes(b"\x08\x07garbage")
    return d / "models"


LATENCY = {
    "measure-huge-input": (lambda d: ["measure", str(_huge_onnx(d))], "at most"),
    "measure-corrupt": (lambda d: ["measure", str(_corrupt_onnx(d))], "m.onnx"),
    "measure-missing": (lambda d: ["measure", "nope"], "nope"),
    "measure-out-unwritable": (lambda d: ["measure", str(_corrupt_onnx(d)), "--out",
                                          "/proc/m.csv"], "cannot write in /proc"),
    "predict-out-unwritable": (lambda d: ["predict", "--device", "edgetpu-est", "--space",
                                          "mbv3-tiny", "--archs", "archs.csv", "--out",
                                          "/proc/p.csv"], "cannot write in /proc"),
    "predict-out-exists": (lambda d: ["predict", "--device", "edgetpu-est", "--space",
                                      "mbv3-tiny", "--archs", "archs.csv", "--out", "a_file"],
                           "already exists"),
    "predict-unknown-device": (lambda d: ["predict", "--device", "toaster", "--space",
                                          "mbv3-tiny", "--archs", "archs.csv", "--out", "p.csv"],
                               "toaster"),
    "adapt-seed": (lambda d: ["adapt", "--device", "x", "--space", "nb201", "--measurements",
                              "archs.csv", "--seed", "-5"], "expected a seed from 0"),
}


@pytest.mark.parametrize("case", list(LATENCY))
def test_bad_latency_commands(case, workdir, capsys, monkeypatch):
    from hwnas.supernet.spaces import get_space

    monkeypatch.setenv("HWNAS_DEVICE_DIR", str(workdir / "devices"))
    space = get_space("mbv3-tiny")
    (workdir / "archs.csv").write_text(f"arch\n{space.to_string(space.largest())}\n")
    make, message = LATENCY[case]
    assert_clean_refusal(["latency", *make(workdir)], message, capsys, workdir)
