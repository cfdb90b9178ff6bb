"""Helpers shared by the training tests."""

from __future__ import annotations

import torch
from torch import nn


def fresh(space):
    torch.manual_seed(0)
    return space.build_supernet()


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
