"""Where a supernet training step spends its time on the GPU: `hwnas train` of the mbv3
supernet (digits, 1 epoch; a CIFAR-10 subset, 1,280 images) under torch.profiler with CPU and
CUDA activities, cuDNN on and off, each in a fresh process. The profile spans the whole
command (data loading and the closing evaluation included, about 9-10 training steps), so it
reads beside the command's own "trained ... in N s" line. Writes per run the top operators by
self CPU time and by self device time, and the counts of kernel launches, stream/device
synchronisations and host<->device copies (a per-step overhead shows up there, not in FLOPs).
Run on the GPU machine: python benchmarks/results/gpu_matrix/train_profile.py OUTDIR"""
import json
import subprocess
import sys
import time

CHILD = r'''
import sys, json, torch
from torch.profiler import profile, ProfilerActivity
if sys.argv[2] == "off":
    torch.backends.cudnn.enabled = False
from hwnas.cli import main
args = ["train", "--space", "mbv3", "--device", "cuda", "--epochs", "1", "--overwrite", "--quiet",
        "--out", f"/tmp/prof_{sys.argv[1]}_{sys.argv[2]}.pt"]
args += (["--dataset", "digits"] if sys.argv[1] == "digits"
         else ["--dataset", "cifar10", "--limit-train", "1280", "--limit-eval", "256"])
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    main(args)
ka = prof.key_averages()
out = sys.argv[3]
with open(out + ".txt", "w") as f:
    f.write(ka.table(sort_by="self_cpu_time_total", row_limit=40))
    f.write("\n\n")
    for key in ("self_device_time_total", "self_cuda_time_total"):
        try:
            f.write(ka.table(sort_by=key, row_limit=25))
            break
        except (AttributeError, KeyError, ValueError):
            continue
counts = {e.key: e.count for e in ka if any(s in e.key for s in (
    "cudaLaunchKernel", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy",
    "cudaEventSynchronize", "cudnn", "aten::item", "aten::_local_scalar_dense", "aten::to",
    "aten::copy_"))}
json.dump(counts, open(out + ".json", "w"), indent=1)
'''

out = sys.argv[1]
summary = {}
# the realistic case first (a command cut off by its time limit keeps the runs done)
for data, cudnn in (("cifar10", "on"), ("digits", "off"), ("digits", "on"), ("cifar10", "off")):
    tag = f"{data}_cudnn_{cudnn}"
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-c", CHILD, data, cudnn, f"{out}/profile_{tag}"],
                           capture_output=True, text=True, timeout=150)
        rc, text = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, text = 124, str(e.stdout or "")
    summary[tag] = {"rc": rc, "seconds": round(time.perf_counter() - t0, 1), "out": text[-600:]}
    print(tag, summary[tag]["seconds"], "s rc", rc, text[-200:], flush=True)
    json.dump(summary, open(f"{out}/train_profile.json", "w"), indent=1)
