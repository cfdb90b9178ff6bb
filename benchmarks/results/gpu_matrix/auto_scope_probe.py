"""Session 42's check on the GPU of ``hwnas train --compile-scope auto`` (the new default): a
CCT supernet on CUDA gets the masked random subnets (``subnets``) and cuDNN autotuning, an mbv3
supernet ``model`` and no autotuning. Runs ``hwnas train`` in this process for a few steps and
records the TrainOptions it built; prints one line per case and exits non-zero on a mismatch.

    python benchmarks/results/gpu_matrix/auto_scope_probe.py
"""

import sys
import tempfile

import torch
import hwnas.supernet.train_run as train_run
from hwnas.cli import main

seen = []
_options = train_run.TrainOptions


def _record(*args, **kwargs):
    opts = _options(*args, **kwargs)
    seen.append((opts.compile_scope, torch.backends.cudnn.benchmark))
    return opts


train_run.TrainOptions = _record
bad = 0
for space, want in (("cct", ("subnets", True)), ("mbv3-tiny", ("model", False))):
    with tempfile.TemporaryDirectory() as tmp:
        rc = main(["train", "--space", space, "--dataset", "digits", "--epochs", "1",
                   "--limit-train", "256", "--limit-eval", "64", "--compile", "reduce-overhead",
                   "--device", "cuda", "--out", f"{tmp}/run", "--quiet"])
    got = seen[-1] if seen else None
    ok = rc == 0 and got == want
    bad += not ok
    print(f"{space}: rc {rc}, (compile_scope, cudnn.benchmark) {got}, expected {want}: "
          f"{'ok' if ok else 'MISMATCH'}")
sys.exit(1 if bad else 0)
