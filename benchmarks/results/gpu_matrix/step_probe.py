"""Why a sandwich step of the mbv3 supernet takes about a second on an H100/H200: per-step
times of the training step alone (no data loading: one random batch of 128 on the device),
bf16 autocast and channels-last as `hwnas train` uses on a GPU, each variant in a fresh process:

- ``sample``: the real step (largest, smallest and two random subnets, new ones every step),
  the library as it is (since session 35 its depthwise convolutions skip cuDNN on a GPU);
- ``sample_cudnndw``: the same with the depthwise convolutions through cuDNN (before);
- ``repeat``: the same four subnets every step (no new convolution shapes after step 1);
- ``profile``: ``sample`` with torch.profiler over its last 5 steps: the top operators by host
  and device time, and the synchronisations and copies;
- ``cold``, ``cold_nocudnn``, ``cold_dwnative``: the first and second forward+backward of 24
  new depthwise and pointwise convolution shapes each (cuDNN on; off; the library's native
  depthwise path): what a new shape costs. Session 35 (H100): a new depthwise shape cost
  0.91 s median through cuDNN, 0.9 ms without it.

Prints per-step seconds (first 10, then the median of the rest) and the distinct convolution
shapes seen; writes OUT/step_probe.json.
Run on the GPU machine:
  python benchmarks/results/gpu_matrix/step_probe.py OUT [STEPS] [DEVICE] [BATCH] [VARIANT,...]"""
import json
import statistics
import subprocess
import sys
import time

CHILD = r'''
import sys, time, json, numpy as np, torch, torch.nn.functional as F
variant, steps, device, batch = sys.argv[1], int(sys.argv[2]), torch.device(sys.argv[3]), int(sys.argv[4])
if variant.endswith("nocudnn"):
    torch.backends.cudnn.enabled = False
from hwnas.supernet.nn import dynamic_ops
if variant.endswith("cudnndw"):  # the depthwise convolutions through cuDNN (before session 35)
    _dw = dynamic_ops.depthwise_conv2d
    dynamic_ops.depthwise_conv2d = lambda x, w, s, p, native=None: _dw(x, w, s, p, native=False)
if variant.startswith("cold"):  # first and second fwd+bwd of new convolution shapes
    dev = torch.device(sys.argv[3]); rows = []
    for i, (c, k, s, hw) in enumerate([(c, k, s, hw) for c in (72, 120, 240, 480) for k in (3, 5, 7)
                                       for s, hw in ((1, 16), (2, 8))]):
        for kind in ("dw", "pw"):
            x = torch.randn(128, c, hw, hw, device=dev, requires_grad=True).contiguous(memory_format=torch.channels_last)
            w = torch.randn(c, 1, k, k, device=dev, requires_grad=True) if kind == "dw" else torch.randn(c + 8 * i, c, 1, 1, device=dev, requires_grad=True)
            t = []
            for rep in range(2):
                torch.cuda.synchronize(); t0 = time.perf_counter()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    y = (dynamic_ops.depthwise_conv2d(x, w, s, k // 2, native=variant.endswith("dwnative"))
                         if kind == "dw" else F.conv2d(x, w))
                y.float().sum().backward()
                torch.cuda.synchronize(); t.append(time.perf_counter() - t0)
            rows.append({"kind": kind, "c": c, "k": k, "s": s, "hw": hw, "first": t[0], "second": t[1]})
    print(json.dumps({"variant": variant, "cold": rows})); raise SystemExit
from hwnas.supernet.spaces import get_space
space = get_space("mbv3", in_channels=3, image_size=32, num_classes=10)
net = space.build_supernet().to(device)
cl = device.type == "cuda"
if cl:
    net = net.to(memory_format=torch.channels_last)
opt = torch.optim.AdamW(net.parameters(), lr=1e-3, fused=device.type == "cuda")
x = torch.randn(batch, 3, 32, 32, device=device)
if cl:
    x = x.contiguous(memory_format=torch.channels_last)
y = torch.randint(0, 10, (batch,), device=device)
rng = np.random.default_rng(0)
shapes = set()
def hook(m, inp, out):
    shapes.add((tuple(inp[0].shape), tuple(out.shape), m.__class__.__name__))
for m in net.modules():
    if isinstance(m, torch.nn.Conv2d) or "Conv" in m.__class__.__name__:
        m.register_forward_hook(hook)
fixed = [space.largest(), space.smallest(), space.sample(rng), space.sample(rng)]
amp = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device.type == "cuda" else (lambda: torch.autocast("cpu", enabled=False))
times, nshapes = [], []
prof = None
if variant.startswith("profile"):  # torch.profiler over the last 5 steps: where 0.2 s goes
    from torch.profiler import ProfilerActivity, profile, schedule
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                   schedule=schedule(wait=steps - 6, warmup=1, active=5))
    prof.start()
for step in range(steps):
    archs = fixed if variant.startswith("repeat") else [space.largest(), space.smallest(), space.sample(rng), space.sample(rng)]
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    soft = None
    for i, a in enumerate(archs):
        net.set_active(a)
        with amp():
            out = net(x).float()
        loss = F.cross_entropy(out, y) if soft is None else -(soft * F.log_softmax(out, 1)).sum(1).mean()
        loss.backward()
        if soft is None:
            soft = F.softmax(out.detach(), 1)
    opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
    nshapes.append(len(shapes))
    if prof is not None:
        prof.step()
extra = {}
if prof is not None:
    prof.stop()
    ev = prof.key_averages()
    extra["top_cpu"] = [(e.key, e.count, round(e.self_cpu_time_total / 5e3, 2)) for e in
                        sorted(ev, key=lambda e: -e.self_cpu_time_total)[:20]]
    extra["top_cuda"] = [(e.key, e.count, round(e.self_device_time_total / 5e3, 2)) for e in
                         sorted(ev, key=lambda e: -e.self_device_time_total)[:15]]
    extra["sync_copy"] = [(e.key, e.count) for e in ev if "Synchronize" in e.key or "Memcpy" in e.key]
print(json.dumps({"variant": variant, "times": times, "shapes": nshapes, **extra}))
'''


def main() -> None:
    out = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    device = sys.argv[3] if len(sys.argv) > 3 else "cuda"
    batch = sys.argv[4] if len(sys.argv) > 4 else "128"
    res = {}
    variants = sys.argv[5].split(",") if len(sys.argv) > 5 else [
        "cold_dwnative", "sample", "sample_cudnndw", "profile", "repeat"]
    for variant in variants:
        t0 = time.perf_counter()
        try:
            p = subprocess.run([sys.executable, "-c", CHILD, variant, str(steps), device, batch],
                               capture_output=True, text=True, timeout=150)
            r = json.loads((p.stdout.strip().splitlines() or [""])[-1] or "null") or {
                "variant": variant, "error": (p.stderr or p.stdout)[-800:]}
        except subprocess.TimeoutExpired:
            r = {"variant": variant, "error": "timed out after 150 s"}
        r["seconds"] = round(time.perf_counter() - t0, 1)
        res[variant] = r
        t = r.get("times", [])
        if r.get("cold"):
            for kind in ("dw", "pw"):
                rows = [c for c in r["cold"] if c["kind"] == kind]
                print(f"{variant:15s} {kind}: {len(rows)} new shapes, first call median "
                      f"{statistics.median(c['first'] for c in rows) * 1e3:.1f} ms (max "
                      f"{max(c['first'] for c in rows) * 1e3:.0f}), second "
                      f"{statistics.median(c['second'] for c in rows) * 1e3:.2f} ms", flush=True)
        elif t:
            print(f"{variant:15s} first 10: {' '.join(f'{v:.2f}' for v in t[:10])}  median rest "
                  f"{statistics.median(t[10:] or t):.3f} s  last 10 {statistics.median(t[-10:]):.3f} s  "
                  f"shapes {r['shapes'][0]} -> {r['shapes'][-1]}  ({r['seconds']} s)", flush=True)
        else:
            print(variant, r.get("error"), flush=True)
        for key in ("top_cpu", "top_cuda", "sync_copy"):
            for row in r.get(key, []):
                print(f"  {key} {row}", flush=True)
        with open(f"{out}/step_probe.json", "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main()
