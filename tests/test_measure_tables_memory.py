"""benchmarks/measure_latency_tables.py: exporting many architectures in one worker must not
keep every traced network alive (TorchScript's process-wide type registry did: ~35 MB each)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnx")

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import gc, sys, tempfile
from pathlib import Path
sys.path.insert(0, {root!r})
from benchmarks import measure_latency_tables as mlt
forget = {forget}
if not forget:
    mlt.forget_torchscript_types = lambda: None
def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
archs = mlt.read_sample("nb201", 2000)[:9]
runner, d = mlt.CpuRunner(1, 2, 10.0), Path(tempfile.mkdtemp())
runner.prepare("nb201", archs[0], d / "a.onnx", d / "a.pt")  # first-use allocations
gc.collect()
base = rss_mb()
for i, arch in enumerate(archs[1:]):
    runner.prepare("nb201", arch, d / f"{{i}}.onnx", d / f"{{i}}.pt")
gc.collect()
print((rss_mb() - base) / (len(archs) - 1))
"""


def _growth_mb(forget: bool) -> float:
    code = PROBE.format(root=str(ROOT), forget=forget)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": ""}, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return float(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/statm").is_file(), reason="needs /proc (Linux)")
def test_exports_do_not_accumulate_traced_networks() -> None:
    kept, forgotten = _growth_mb(False), _growth_mb(True)
    assert kept > 15, kept  # the leak this guards against is real in this PyTorch
    assert forgotten < kept / 3, (forgotten, kept)


def test_traced_files_still_load_and_run_after_forgetting(tmp_path) -> None:
    import torch
    from benchmarks import measure_latency_tables as mlt

    runner = mlt.CpuRunner(1, 3, 10.0)
    archs = mlt.read_sample("nb201", 2000)[:2]
    for i, arch in enumerate(archs):  # the second export follows a forget
        runner.prepare("nb201", arch, tmp_path / f"{i}.onnx", tmp_path / f"{i}.pt")
        med, cv = runner.measure("ts", 1, "nb201", arch, tmp_path / f"{i}.onnx", tmp_path / f"{i}.pt")
        assert med > 0 and cv >= 0
    ts = torch.jit.load(str(tmp_path / "1.pt"))
    want = runner.module("nb201", archs[1])(torch.ones(1, 3, 32, 32))
    assert torch.allclose(ts(torch.ones(1, 3, 32, 32)), want, atol=1e-4)
