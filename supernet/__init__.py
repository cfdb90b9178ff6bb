"""Search spaces and weight-sharing supernets.

Importing this package does not import torch: the space declarations and the layer list are
plain Python, and only the supernet modules (``hwnas.supernet.nn``) and training need torch.
"""

from hwnas.supernet.layers import Layer, total_flops, total_macs, total_params
from hwnas.supernet.space import SearchSpace
from hwnas.supernet.spaces import available_spaces, get_space, register_space

from hwnas.core.errors import UserError

#: torch-based names, imported on first access so that ``import hwnas.supernet`` stays light
_LAZY = {
    "load_dataset": "hwnas.supernet.data.sources",
    "shared_data_dir": "hwnas.supernet.data",
    "BatchLoader": "hwnas.supernet.data.loader",
    "accuracy": "hwnas.supernet.evaluate",
    "calibration_loader": "hwnas.supernet.evaluate",
    "eval_loader": "hwnas.supernet.evaluate",
    "evaluate_subnet": "hwnas.supernet.evaluate",
    "TrainConfig": "hwnas.supernet.recipes",
    "TrainStage": "hwnas.supernet.recipes",
    "sandwich_config": "hwnas.supernet.recipes",
    "train_supernet": "hwnas.supernet.train",
    "TrainOptions": "hwnas.supernet.train_options",
}

#: The supported names (the docs' API reference); others importable here are internal.
__all__ = [
    *(n for n in _LAZY if n != "BatchLoader"),
    "Layer",
    "SearchSpace",
    "available_spaces",
    "get_space",
    "register_space",
    "total_flops",
    "total_macs",
    "total_params",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hwnas.supernet' has no attribute {name!r}")
