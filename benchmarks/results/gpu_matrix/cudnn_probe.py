"""Why supernet training on a GPU can run slower than on a CPU: the same `hwnas train` of the
mbv3 supernet on digits, timed with cuDNN on and off (each a fresh process), and the top of a
cProfile of the default one. Run on the GPU machine: python benchmarks/results/gpu_matrix/cudnn_probe.py OUTDIR"""
import cProfile
import io
import json
import pstats
import subprocess
import sys
import time

out = sys.argv[1]
res = {}
for label, pre in (("cudnn_on", ""), ("cudnn_off", "torch.backends.cudnn.enabled = False; "),
                   ("cudnn_benchmark", "torch.backends.cudnn.benchmark = True; ")):
    code = (f"import torch; {pre}from hwnas.cli import main; "
            "raise SystemExit(main(['train', '--space', 'mbv3', '--dataset', 'digits', '--device', 'cuda', "
            "'--epochs', '1', '--out', '/tmp/probe_%s.pt', '--overwrite', '--quiet']))" % label)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    res[label] = {"rc": p.returncode, "seconds": round(time.perf_counter() - t0, 1),
                  "out": (p.stdout + p.stderr)[-800:]}
    print(label, res[label]["seconds"], "s", res[label]["out"][-300:], flush=True)
    json.dump(res, open(f"{out}/cudnn_probe.json", "w"), indent=1)
prof = cProfile.Profile()
from hwnas.cli import main  # noqa: E402
prof.enable()
main(["train", "--space", "mbv3", "--dataset", "digits", "--device", "cuda", "--epochs", "1",
      "--out", "/tmp/probe_prof.pt", "--overwrite", "--quiet"])
prof.disable()
s = io.StringIO()
pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(20)
open(f"{out}/cudnn_probe_profile.txt", "w").write(s.getvalue())
print(s.getvalue()[-4000:])
