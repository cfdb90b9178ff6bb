"""Session 42: what the masked random subnets cost on a CPU, against the sliced ones (why
``hwnas train --compile-scope auto`` keeps ``model`` off CUDA). Eager forward + backward of six
random cct subnets, batch 32, one thread, the two ways interleaved over 3 rounds; prints the
median seconds per subnet step::

    python benchmarks/results/supernet_cifar10/masked_cpu_cost.py
"""
import time, statistics, numpy as np, torch
torch.set_num_threads(1)
from hwnas.supernet.spaces import get_space
space = get_space("cct", num_classes=10)
net = space.build_supernet().train()
rng = np.random.default_rng(0)
archs = [space.sample(rng) for _ in range(6)]
x = torch.randn(32, 3, 32, 32)
def sliced(a):
    net.set_active(a); net(x).sum().backward()
def masked(a):
    net.set_active(space.largest()); net.forward_masked(x, net.arch_masks(a)).sum().backward()
res = {"sliced": [], "masked": []}
for r in range(3):
    for name, f in (("sliced", sliced), ("masked", masked)):
        t = time.perf_counter()
        for a in archs: f(a)
        res[name].append(time.perf_counter() - t)
print({k: round(statistics.median(v) / len(archs), 3) for k, v in res.items()}, "s per random subnet step (fwd+bwd, batch 32, 1 thread, eager)")
