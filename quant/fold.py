"""BatchNorm folding: merge each BatchNorm2d into the convolution that feeds it.

Deployed integer networks have no BatchNorm: its affine transform (with the running
statistics) is merged into the preceding convolution, ``W' = W * gamma / sqrt(var + eps)``
per output channel and ``b' = (b - mean) * gamma / sqrt(var + eps) + beta``. Quantizing the
folded weights is what makes the simulated network match the deployed one, so
:func:`hwnas.quant.ptq.quantize_model` folds first.

Which BN follows which conv is found with ``torch.fx`` (a BN whose only input is a conv output
that nothing else reads). For a model fx cannot trace, pass ``example_input``: forward hooks
then pair each BN with the conv whose output tensor it receives, and the folded model is
checked against the original on that input.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from hwnas.core.errors import UserError

__all__ = ["fold_bn", "find_conv_bn_pairs"]


def _fx_pairs(model: nn.Module) -> list[tuple[str, str]]:
    import torch.fx

    graph = torch.fx.symbolic_trace(model).graph
    modules = dict(model.named_modules())
    pairs = []
    for node in graph.nodes:
        if node.op != "call_module" or not isinstance(modules.get(node.target), nn.BatchNorm2d):
            continue
        src = node.args[0] if node.args else None
        if (isinstance(src, torch.fx.Node) and src.op == "call_module"
                and isinstance(modules.get(src.target), nn.Conv2d) and len(src.users) == 1):
            pairs.append((src.target, node.target))
    return pairs


@torch.no_grad()
def _hook_pairs(model: nn.Module, example_input: torch.Tensor) -> list[tuple[str, str]]:
    outputs: dict[int, str] = {}
    pairs: list[tuple[str, str]] = []
    handles = []

    def conv_hook(name):
        def hook(_m, _inp, out):
            outputs[id(out)] = name
        return hook

    def bn_hook(name):
        def hook(_m, inp):
            conv = outputs.get(id(inp[0]))
            if conv is not None and (conv, name) not in pairs:
                pairs.append((conv, name))
        return hook

    for name, m in model.named_modules():
        if isinstance(m, nn.Conv2d):
            handles.append(m.register_forward_hook(conv_hook(name)))
        elif isinstance(m, nn.BatchNorm2d):
            handles.append(m.register_forward_pre_hook(bn_hook(name)))
    was_training = model.training
    model.eval()
    try:
        model(example_input)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return pairs


def find_conv_bn_pairs(model: nn.Module, example_input: torch.Tensor | None = None
                       ) -> list[tuple[str, str]]:
    """``(conv name, bn name)`` for each BatchNorm2d that directly follows a Conv2d."""
    try:
        return _fx_pairs(model)
    except Exception as exc:  # fx raises many types for untraceable code
        if example_input is None:
            raise UserError(
                f"cannot fold BatchNorm: torch.fx cannot trace {type(model).__name__} "
                f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); pass an "
                f"example input so the conv->BN pairs can be found by running the model"
            ) from None
        return _hook_pairs(model, example_input)


def _set_module(root: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, module)


@torch.no_grad()
def _fold_pair(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    if bn.num_features != conv.out_channels:
        raise ValueError(f"BN with {bn.num_features} features after a conv with "
                         f"{conv.out_channels} outputs")
    folded = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                       conv.padding, conv.dilation, conv.groups, True, conv.padding_mode,
                       device=conv.weight.device, dtype=conv.weight.dtype)
    mean = bn.running_mean if bn.track_running_stats and bn.running_mean is not None else None
    var = bn.running_var if bn.track_running_stats and bn.running_var is not None else None
    if mean is None or var is None:
        raise UserError("cannot fold a BatchNorm2d without running statistics "
                        "(track_running_stats=False); folding needs eval-mode statistics")
    gamma = bn.weight if bn.affine else torch.ones_like(mean)
    beta = bn.bias if bn.affine else torch.zeros_like(mean)
    factor = gamma / torch.sqrt(var + bn.eps)
    folded.weight.copy_(conv.weight * factor.view(-1, 1, 1, 1))
    bias = conv.bias if conv.bias is not None else torch.zeros_like(mean)
    folded.bias.copy_((bias - mean) * factor + beta)
    folded.train(conv.training)
    return folded


def fold_bn(model: nn.Module, example_input: torch.Tensor | None = None) -> nn.Module:
    """A copy of ``model`` with every BatchNorm2d that follows a Conv2d folded into it.

    The folded conv keeps the conv's qualified name and gets a bias; the BN becomes an
    ``nn.Identity`` under its own name. The copy is in eval mode and computes the same outputs
    as ``model`` in eval mode. ``model`` itself is never modified. BatchNorms that do not follow
    a conv stay as they are (float).

    Examples:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        ...                             torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 10)).eval()
        >>> from hwnas.quant import fold_bn
        >>> folded = fold_bn(model)
        >>> any(isinstance(m, torch.nn.BatchNorm2d) for m in folded.modules())
        False
        >>> x = torch.randn(2, 1, 8, 8)
        >>> torch.allclose(folded(x), model(x), atol=1e-5)
        True
    """
    pairs = find_conv_bn_pairs(model, example_input)
    folded = copy.deepcopy(model)
    for conv_name, bn_name in pairs:
        conv = folded.get_submodule(conv_name)
        bn = folded.get_submodule(bn_name)
        _set_module(folded, conv_name, _fold_pair(conv, bn))
        _set_module(folded, bn_name, nn.Identity())
    folded.eval()
    if example_input is not None and pairs:
        with torch.no_grad():
            was = model.training
            model.eval()
            try:
                ref = model(example_input)
            finally:
                model.train(was)
            got = folded(example_input)
        tol = 1e-3 * max(1.0, float(ref.abs().max()))
        if not torch.allclose(ref, got, atol=tol, rtol=1e-3):
            raise UserError(
                f"BatchNorm folding changed the outputs of {type(model).__name__} (max diff "
                f"{float((ref - got).abs().max()):.3g}); a folded conv output is probably read "
                f"elsewhere too"
            )
    return folded
