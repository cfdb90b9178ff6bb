"""The base of every weight-sharing supernet: it owns :meth:`Supernet.extract`.

A supernet selects its active subnet (``set_active``), says which one is active
(``active_arch``) and builds the static network of the active subnet (``static_net``, from the
``static()`` copies of its dynamic operators, :mod:`hwnas.supernet.nn.dynamic_ops`).
Extraction itself -- select, build on the supernet's device without gradients, restore the
previous subnet, eval mode -- is the same for every space and lives here once.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class Supernet(nn.Module):
    """A weight-sharing supernet of a search space (``self.space``); subclasses implement
    :meth:`set_active`, :meth:`active_arch` and :meth:`static_net`."""

    space: Any
    #: Whether training-mode forward passes apply the space's regularisers (dropout,
    #: stochastic depth; spaces without any ignore it). Training switches it off for the
    #: smaller subnets of a sandwich step with ``TrainConfig.regularise`` ``"largest"``.
    regularise: bool = True

    def set_active(self, arch: Any) -> Any:
        """Select the subnet ``arch`` (an architecture or its string) for later forward passes."""
        raise NotImplementedError

    def active_arch(self) -> Any:
        """The active subnet's architecture."""
        raise NotImplementedError

    def static_net(self) -> nn.Module:
        """A plain network of copies of the active subnet's weights (called by :meth:`extract`
        under ``torch.no_grad`` and on the supernet's device)."""
        raise NotImplementedError

    @torch.no_grad()
    def extract(self, arch: Any = None) -> nn.Module:
        """A standalone copy of the subnet ``arch`` (default: the active one), in eval mode.

        The active subnet is left as it was."""
        previous = self.active_arch()
        if arch is not None:
            self.set_active(arch)
        device = next(self.parameters()).device
        try:  # built on the supernet's device: no copy through the default device
            with torch.device(device):
                net = self.static_net()
        finally:
            self.set_active(previous)
        return net.to(device).eval()
