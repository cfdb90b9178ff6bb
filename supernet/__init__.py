"""Search spaces and weight-sharing supernets.

Importing this package does not import torch: the space declarations and the layer list are
plain Python, and only the supernet modules (``hwnas.supernet.nn``) and training need torch.
"""

from hwnas.supernet.layers import Layer, total_flops, total_macs, total_params
from hwnas.supernet.space import SearchSpace
from hwnas.supernet.spaces import available_spaces, get_space, register_space

from hwnas.core.errors import UserError

__all__ = [
    "Layer",
    "SearchSpace",
    "UserError",
    "available_spaces",
    "get_space",
    "register_space",
    "total_flops",
    "total_macs",
    "total_params",
]
