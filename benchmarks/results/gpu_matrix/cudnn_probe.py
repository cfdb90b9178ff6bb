"""Why supernet training on a GPU can run slower than on a CPU: the same `hwnas train` of the
mbv3 supernet, timed with cuDNN on, off and in benchmark mode (each a fresh process), on digits
(1 epoch, 8x8 images: every sandwich step samples shapes cuDNN has not planned) and on a
CIFAR-10 subset (5,000 images, 2 epochs: shapes repeat more), so the choice is made on both.
Run on the GPU machine: python benchmarks/results/gpu_matrix/cudnn_probe.py OUTDIR [digits|cifar10 ...]"""
import json
import subprocess
import sys
import time

out = sys.argv[1]
workloads = sys.argv[2:] or ["digits", "cifar10"]
ARGS = {"digits": ["--dataset", "digits", "--epochs", "1"],
        "cifar10": ["--dataset", "cifar10", "--epochs", "2", "--limit-train", "5000"]}
res = {}
for w in workloads:
    for label, pre in (("cudnn_on", ""), ("cudnn_off", "torch.backends.cudnn.enabled = False; "),
                       ("cudnn_benchmark", "torch.backends.cudnn.benchmark = True; ")):
        argv = ["train", "--space", "mbv3", "--device", "cuda", *ARGS[w],
                "--out", f"/tmp/probe_{w}_{label}.pt", "--overwrite", "--quiet"]
        code = f"import torch; {pre}from hwnas.cli import main; raise SystemExit(main({argv!r}))"
        t0 = time.perf_counter()
        try:
            p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
            rc, text = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            rc, text = 124, str(e.stdout or "")
        res[f"{w}/{label}"] = {"rc": rc, "seconds": round(time.perf_counter() - t0, 1),
                               "out": text[-800:]}
        print(w, label, res[f"{w}/{label}"]["seconds"], "s", text[-300:], flush=True)
        json.dump(res, open(f"{out}/cudnn_probe.json", "w"), indent=1)
