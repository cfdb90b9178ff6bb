"""Re-save a CCT supernet run as the shipped fp16 file (session 43; how sessions 40 and 42 saved
theirs): ``save_checkpoint(..., half=True)`` with the run's dataset, training configuration and
data record. A run's resumable ``checkpoint.pt`` stopped before its end (session 43's, at step
68,649 of 70,200) gets its history, seconds and where it stopped as ``extra``; a finished
``supernet.pt`` keeps its own ``extra``::

    python benchmarks/results/supernet_cifar10/cct43/save_half.py SRC [DST]
"""

import sys

from hwnas.supernet.checkpoint_io import load_checkpoint, save_checkpoint
from hwnas.supernet.recipes import TrainConfig

src = sys.argv[1]
dst = sys.argv[2] if len(sys.argv) > 2 else "supernet/checkpoints/cct_cifar10.pt"
space, net, p = load_checkpoint(src)
ts = p.get("train_state")
if ts and ts["step"] < ts["total_steps"]:
    extra = {"train_seconds": ts["seconds"], "history": ts["history"],
             "stopped_at_step": ts["step"], "total_steps": ts["total_steps"],
             "stopped_because": "device time ran out; the remaining steps run at under 0.13 % of "
                                "the peak learning rate"}
else:
    extra = p["extra"]
save_checkpoint(dst, net.float(), space, dataset=p["dataset"],
                train_config=TrainConfig.from_dict(p["train_config"]), extra=extra, half=True,
                data_record=p["data_record"])
