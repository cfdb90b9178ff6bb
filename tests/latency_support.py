"""Helpers of the latency tests (test_latency_*.py): sampled architecture strings, a tiny ONNX
model and a measurements CSV whose latencies follow the FLOPs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
from hwnas.latency.onnx_measure import openvino_available
from hwnas.supernet.spaces import get_space
from onnx import TensorProto, helper, numpy_helper

SPACE = "mbv3-tiny"
#: marks a test that needs OpenVINO (the ``openvino`` extra)
needs_ov = pytest.mark.skipif(not openvino_available(),
                              reason="OpenVINO is not installed (pip install -e '.[openvino]')")
#: the standalone on-device script, copied to devices as it is
ONDEVICE = Path(__file__).resolve().parents[1] / "latency" / "ondevice.py"


def sample_archs(n: int, seed: int = 0, space_name: str = SPACE) -> list[str]:
    """``n`` distinct architecture strings of ``space_name``, drawn with ``seed``."""
    space = get_space(space_name)
    rng = np.random.default_rng(seed)
    out: list[str] = []
    while len(out) < n:
        s = space.to_string(space.sample(rng))
        if s not in out:
            out.append(s)
    return out


def write_measurements(path: Path, n: int = 8, seed: int = 0) -> tuple[list[str], np.ndarray]:
    """A measurements CSV (arch, latency_ms) of ``n`` sampled architectures, latency linear in
    their FLOPs; returns the architectures and latencies."""
    space = get_space(SPACE)
    archs = sample_archs(n, seed=seed)
    ms = np.array([space.flops(space.parse(a)) for a in archs]) / 1e6 * 0.3 + 0.05
    pd.DataFrame({"arch": archs, "latency_ms": ms}).to_csv(path, index=False)
    return archs, ms


def tiny_onnx(arch: str | None = None, width: int = 8, **props: str) -> bytes:
    """A float model ``relu(x @ W)`` with a dynamic batch; with ``arch``, the metadata ``arch``
    and ``props``."""
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
        helper.set_model_props(model, {"arch": arch, **props})
    onnx.checker.check_model(model)
    return model.SerializeToString()


def run_ondevice_without(blocked: set[str], args: list[str], cwd: Path,
                         ) -> subprocess.CompletedProcess:
    """Run the on-device script with ``args`` in an isolated interpreter in which the top-level
    packages ``blocked`` cannot be imported (as on a device that lacks them)."""
    blocker = (
        "import sys, runpy\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {sorted(blocked)!r}:\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        f"sys.argv = ['ondevice.py', *{[str(a) for a in args]!r}]\n"
        f"runpy.run_path({str(ONDEVICE)!r}, run_name='__main__')\n"
    )
    return subprocess.run([sys.executable, "-I", "-c", blocker], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def linear_onnx(weight: np.ndarray) -> bytes:
    """``y = x @ weight`` on a dynamic-batch ``[N, k]`` float input: a model whose predictions
    are ``argmax(x @ weight)``, for tests of verification and timing."""
    k, m = weight.shape
    w = numpy_helper.from_array(weight.astype(np.float32), name="W")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "lin",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", m])],
                              initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=8).SerializeToString()
