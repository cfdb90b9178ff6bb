"""Why a sandwich step of the mbv3 supernet takes about a second on an H100/H200: per-step
times of the training step alone (no data loading: one random batch of 128 on the device),
bf16 autocast and channels-last as `hwnas train` uses on a GPU, in four variants, each in a
fresh process:

- ``sample``: the real step (largest, smallest and two random subnets, new ones every step);
- ``repeat``: the same four subnets every step (no new convolution shapes after step 1);
- ``sample_nocudnn``: the real step with cuDNN switched off;
- ``sample_dwnative``: the real step with cuDNN off for the depthwise convolutions only;
- ``cold*``: the first and second forward+backward of 24 new depthwise and pointwise
  convolution shapes each (cuDNN on, off, off for depthwise only): what a new shape costs.

If new shapes cost the time (cuDNN building a plan per new convolution shape), ``sample`` stays
slow while ``repeat`` is fast after its first step and ``sample`` speeds up as shapes recur.
Prints per-step seconds (first 10, then the median of the rest) and the distinct convolution
shapes seen; writes OUT/step_probe.json.
Run on the GPU machine: python benchmarks/results/gpu_matrix/step_probe.py OUT [STEPS] [DEVICE] [BATCH]"""
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
if variant.endswith("dwnative"):  # cuDNN off for grouped (depthwise) convolutions only
    _conv2d = F.conv2d
    class _DW(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, stride, padding, groups):
            ctx.save_for_backward(x, w); ctx.args = (stride, padding, groups)
            with torch.backends.cudnn.flags(enabled=False):
                return _conv2d(x, w, None, stride, padding, 1, groups)
        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors; stride, padding, groups = ctx.args
            st = [stride] * 2 if isinstance(stride, int) else list(stride)
            pd = [padding] * 2 if isinstance(padding, int) else list(padding)
            with torch.backends.cudnn.flags(enabled=False):
                gi, gw, _ = torch.ops.aten.convolution_backward(
                    g, x, w, None, st, pd, [1, 1], False, [0, 0], groups, [True, True, False])
            return gi, gw, None, None, None
    def _patched(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
        if groups > 1 and b is None and dilation == 1 and x.is_cuda:
            return _DW.apply(x, w, stride, padding, groups)
        return _conv2d(x, w, b, stride, padding, dilation, groups)
    F.conv2d = _patched
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
                    y = F.conv2d(x, w, None, s, k // 2, 1, c) if kind == "dw" else F.conv2d(x, w)
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
print(json.dumps({"variant": variant, "times": times, "shapes": nshapes}))
'''


def main() -> None:
    out = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    device = sys.argv[3] if len(sys.argv) > 3 else "cuda"
    batch = sys.argv[4] if len(sys.argv) > 4 else "128"
    res = {}
    for variant in ("cold", "cold_nocudnn", "cold_dwnative", "sample", "repeat", "sample_dwnative",
                    "sample_nocudnn"):
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
        with open(f"{out}/step_probe.json", "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main()
