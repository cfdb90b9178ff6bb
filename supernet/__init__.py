"""Search spaces and weight-sharing supernets.

Importing this package does not import torch: the space declarations and the layer list are
plain Python, and only the supernet modules (``supernet.nn``) and training need torch.
"""

from supernet.errors import UserError
from supernet.layers import Layer, total_flops, total_macs, total_params
from supernet.space import SearchSpace
from supernet.spaces import available_spaces, get_space, register_space

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
