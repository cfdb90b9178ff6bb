"""Data-parallel supernet training with 2 CPU processes (torchrun, gloo backend)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from hwnas.supernet.distributed import DistContext, all_reduce_gradients, shard

REPO = Path(__file__).resolve().parent.parent

WORKER = textwrap.dedent(
    """
    import sys
    import weakref
    from pathlib import Path

    import torch

    torch.set_num_threads(1)
    from hwnas.supernet.distributed import all_reduce_gradients, init_from_env, shutdown
    from hwnas.supernet.spaces import get_space
    from hwnas.supernet.train import TrainConfig, TrainStage, train_supernet
    from hwnas.supernet.decoded import load_training_data

    out = Path(sys.argv[1])
    ctx, device = init_from_env("cpu")
    # the gradient average on its own: a parameter with gradients, one without any
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
    a.grad = torch.tensor([1.0, 2.0]) * (ctx.rank + 1)
    all_reduce_gradients([a, b], ctx)
    grads = {"a": a.grad, "b": b.grad}
    data = load_training_data("digits", limit_train=256)
    space = get_space("mbv3-tiny")
    torch.manual_seed(ctx.rank)  # different init per rank: training must broadcast rank 0's
    net = space.build_supernet()
    init = {k: v.clone() for k, v in net.state_dict().items()}
    config = TrainConfig(stages=[TrainStage("warm", 1, sandwich=False),
                                 TrainStage("sandwich", 1, num_random=1)], batch_size=64)
    result = train_supernet(net, space, data, config, progress=False, dist=ctx, max_steps=6,
                            checkpoint_path=out / "ckpt.pt")
    torch.save({"state": net.state_dict(), "init": init, "step": result.step,
                "images": result.images, "history": result.history, "grads": grads}, out / f"rank{ctx.rank}.pt")
    # leaving the group must free it (gloo's worker threads joined): one that outlived it could
    # drop its last work while the interpreter shuts down, and abort the process
    group = weakref.ref(torch.distributed.group.WORLD)
    shutdown(ctx)
    assert group() is None, "the process group outlived shutdown(): something still holds it"
    """
)


def test_two_processes_train_identically(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(script), str(tmp_path)],
        capture_output=True, text=True, timeout=120, env=env, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    for r in (r0, r1):  # all_reduce_gradients averages and leaves None where no rank has one
        assert torch.allclose(r["grads"]["a"], torch.tensor([1.5, 3.0]))
        assert r["grads"]["b"] is None
    assert r0["step"] == r1["step"] == 6
    assert r0["images"] == 6 * 64  # global images: each rank saw its half of every batch
    # rank 1 started from other weights, yet both end with identical parameters and buffers
    assert any(not torch.equal(r0["init"][k], r1["init"][k]) for k in r0["init"])
    for k, v in r0["state"].items():
        assert torch.equal(v, r1["state"][k]), k
    # and training moved them
    moved = [k for k, v in r0["state"].items()
             if v.is_floating_point() and not torch.equal(v, r0["init"][k])]
    assert "classifier.weight" in moved and "stages.0.0.expand_conv.weight" in moved
    # only rank 0 wrote the checkpoint, and it holds the final weights
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["train_state"]["step"] == 6 and ckpt["train_state"]["world_size"] == 2
    for k, v in r0["state"].items():
        assert torch.equal(v, ckpt["state_dict"][k]), k
    assert not list(tmp_path.glob(".*.tmp"))


def test_shard_and_single_process_reduce_are_identity():
    ctx = DistContext()
    x = torch.arange(8)
    assert shard(x, ctx) is x
    assert torch.equal(shard(x, DistContext(rank=1, world_size=2)), torch.arange(4, 8))
    assert torch.equal(shard(x, DistContext(rank=0, world_size=4)), torch.arange(0, 2))
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 2.0)
    all_reduce_gradients([p], ctx)
    assert torch.equal(p.grad, torch.full((3,), 2.0))
