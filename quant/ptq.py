"""Post-training quantization: apply a policy to a model, calibrate ranges, correct biases.

``ptq(model, policy, batches)`` returns a *new* fake-quantized model and never touches
``model``: the policy applied (BatchNorm folded), ranges calibrated, optionally the weights'
rounding learned (AdaRound), biases corrected; :func:`ptq` gives the steps.

Bad input (policy for another model, bits outside the supported set, empty calibration data,
batches the model cannot take) raises UserError before anything is returned; ``model`` is
unchanged in every case.

The passes over the calibration images call :func:`hwnas.core.cooperate.yield_point` at every
quantized layer (a no-op unless a parallel export installed its pause), so a timing another
process waits for starts within one layer's work, not one whole PTQ.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from hwnas.quant.adaround import AdaRoundConfig, adaround, adaround_targets
from hwnas.quant.fake_quant import (
    QUANT_LAYER_TYPES,
    FakeQuantize,
    QuantConv2d,
    QuantLinear,
    QuantMatMul,
    SharedAddQuant,
    int16_safe_grid_bits,
    quant_layers,
    set_quantizers_enabled,
)
from hwnas.quant.fold import fold_bn
from hwnas.quant.observers import (
    ACT_OBSERVERS,
    WEIGHT_OBSERVERS,
    ActivationObserver,
    weight_qparams,
)
from hwnas.quant.policy import FLOAT_BITS, QuantPolicy, check_bits, product_sources
from hwnas.supernet.nn.vit import MatMul
from torch import nn

from hwnas.core.cooperate import yield_point
from hwnas.core.errors import UserError
from hwnas.core.heap import retained_heap
from hwnas.core.io import first_line

__all__ = [
    "PTQConfig",
    "bias_correct",
    "calibrate",
    "calibration_batches",
    "insert_shared_add_quant",
    "int16_safe_layers",
    "learns_rounding",
    "policy_of",
    "ptq",
    "quantize_model",
    "rounding_learned",
    "set_weight_scales",
]

RESIDUAL_MODES = ("float", "shared")
#: how PTQ rounds the weights (:attr:`PTQConfig.rounding`)
ROUNDINGS = ("nearest", "adaround", "adaround-all")
#: ``rounding="adaround"`` learns the rounding of a model with weights narrower than this (of
#: all its layers) and leaves the others, W6/W8 ones, to nearest rounding: at 8 bits it bought
#: no accuracy for 7-9x the PTQ CPU time (benchmarks/adaround_steps.md, Sessions 33-34), at
#: W6A8 -0.11 to +0.17 point for 5-14x (benchmarks/quant_peers.md, Session 37)
ADAROUND_BELOW_BITS = 6


@dataclass
class PTQConfig:
    """Settings of a PTQ pass.

    ``act_observer``: minmax | percentile | mse; ``weight_observer``: minmax | mse (per channel).
    ``max_images``: calibration images used (a few hundred suffice). ``residual``: "float" keeps
    residual additions in float, "shared" quantizes both inputs of each add with one shared
    quantizer at ``add_bits`` (see :mod:`hwnas.quant.fake_quant`). ``int16_safe``: narrow the
    weight grid where a 16-bit pair sum could saturate (what the portable QDQ export asks for).

    Examples:
        >>> from hwnas.quant import PTQConfig
        >>> config = PTQConfig(act_observer="percentile", percentile=99.9, weight_observer="mse")
        >>> config.act_observer
        'percentile'
    """

    act_observer: str = "minmax"
    weight_observer: str = "minmax"
    percentile: float = 99.99
    mse_grid: int = 40
    bias_correction: bool = True
    max_images: int = 512
    batch_size: int = 256
    max_samples: int = 1 << 20
    residual: str = "float"
    add_bits: int = 8
    seed: int = 0
    #: weights on a grid no x86 integer kernel can saturate (:func:`int16_safe_layers`):
    #: True for every layer that needs it, a tuple of layer names for those only
    int16_safe: bool | tuple[str, ...] = False
    #: "nearest"; "adaround": learned rounding (:mod:`hwnas.quant.adaround`) of every
    #: quantized layer of a model with weights below 6 bits (:data:`ADAROUND_BELOW_BITS`; its
    #: 6- and 8-bit layers too: they make up for the narrower ones' error), none of a W6/W8
    #: one; "adaround-all": of any model
    rounding: str = "nearest"
    #: AdaRound's Adam steps per layer
    adaround_iterations: int = 200

    def validate(self) -> None:
        if self.act_observer not in ACT_OBSERVERS:
            raise UserError(f"unknown activation observer {self.act_observer!r}; expected one of "
                            f"{', '.join(ACT_OBSERVERS)}")
        if self.weight_observer not in WEIGHT_OBSERVERS:
            raise UserError(f"unknown weight observer {self.weight_observer!r}; expected one of "
                            f"{', '.join(WEIGHT_OBSERVERS)}")
        if not 50.0 < self.percentile <= 100.0:
            raise UserError(f"percentile must be in (50, 100], got {self.percentile}")
        if self.batch_size < 1:
            raise UserError(f"batch_size must be positive, got {self.batch_size}")
        if self.max_images < 1:
            raise UserError(f"max_images must be positive, got {self.max_images}")
        if self.mse_grid < 2:
            raise UserError(f"mse_grid must be at least 2, got {self.mse_grid}")
        if self.residual not in RESIDUAL_MODES:
            raise UserError(f"unknown residual mode {self.residual!r}; expected one of "
                            f"{', '.join(RESIDUAL_MODES)}")
        check_bits(self.add_bits, "residual-add activation", "<residual adds>")
        if self.rounding not in ROUNDINGS:
            raise UserError(f"unknown rounding {self.rounding!r}; expected one of "
                            f"{', '.join(ROUNDINGS)}")
        if self.adaround_iterations < 1:
            raise UserError(f"adaround_iterations must be positive, got "
                            f"{self.adaround_iterations}")


# -- building the quantized model ----------------------------------------------------------------

def _set_module(root: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, module)


def _model_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def insert_shared_add_quant(model: nn.Module, bits: int = 8) -> nn.Module:
    """Rewrite every tensor + tensor addition of ``model`` into a :class:`SharedAddQuant` module
    named ``<enclosing module>.add`` (the layer-list name of a residual add) with ``torch.fx``.
    Returns a ``GraphModule`` keeping all other qualified names."""
    import operator

    import torch.fx

    class _Tracer(torch.fx.Tracer):
        def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
            if isinstance(m, (*QUANT_LAYER_TYPES, SharedAddQuant, QuantMatMul, FakeQuantize)):
                return True
            return super().is_leaf_module(m, qualname)

    try:
        graph = _Tracer().trace(model)
    except Exception as exc:  # fx raises many types for untraceable code
        raise UserError(f"residual='shared' needs a torch.fx-traceable model; "
                        f"{type(model).__name__} is not ({first_line(exc)})") from None
    gm = torch.fx.GraphModule(model, graph)
    used = {name for name, _ in gm.named_modules()}
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in (operator.add, torch.add):
            continue
        if len(node.args) != 2 or not all(isinstance(a, torch.fx.Node) for a in node.args):
            continue
        if node.kwargs:
            continue
        stack = node.meta.get("nn_module_stack") or {}
        prefix = list(stack.keys())[-1] if stack else ""
        prefix = prefix if isinstance(prefix, str) else ""
        base = f"{prefix}.add" if prefix else "add"
        name, i = base, 1
        while name in used:
            name, i = f"{base}_{i}", i + 1
        used.add(name)
        parent_name, _, child = name.rpartition(".")
        parent = gm.get_submodule(parent_name) if parent_name else gm
        parent.add_module(child, SharedAddQuant(bits, _model_device(model)))
        with gm.graph.inserting_after(node):
            new = gm.graph.call_module(name, node.args)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return gm


@torch.no_grad()
def set_weight_scales(model: nn.Module, method: str = "minmax", grid: int = 100) -> None:
    """Set every quant layer's per-channel weight scales from its current weights."""
    for _, layer in quant_layers(model):
        yield_point()
        wq: FakeQuantize = layer.weight_quant
        if not wq.is_float:
            wq.set_qparams(weight_qparams(layer.weight, wq.levels_bits, method, grid=grid), 0.0)


def int16_safe_layers(qmodel: nn.Module, only: Iterable[str] | None = None) -> dict[str, int]:
    """Narrow the weight grid of the quant layers of ``qmodel`` (all, or those named in
    ``only``) whose integer products could saturate a 16-bit pair sum on x86 CPUs without VNNI
    (:func:`hwnas.quant.fake_quant.int16_safe_grid_bits`: W8A8 gets 7-bit weights in its int8
    container). Returns ``{layer: grid bits}`` of the layers narrowed; scales are not reset."""
    wanted = None if only is None else set(only)
    narrowed = {}
    for name, layer in quant_layers(qmodel):
        if wanted is not None and name not in wanted:
            continue
        grid = int16_safe_grid_bits(layer.w_bits, layer.a_bits)
        if grid != layer.w_bits:
            layer.weight_quant.grid_bits = grid
            narrowed[name] = grid
    return narrowed


def quantize_model(model: nn.Module, policy: QuantPolicy, *, residual: str = "float",
                   add_bits: int = 8, weight_observer: str = "minmax", mse_grid: int = 40,
                   example_input: torch.Tensor | None = None,
                   int16_safe: bool | Iterable[str] = False) -> nn.Module:
    """A new model: ``model`` with BN folded and each Conv2d/Linear replaced by its quantized
    version at the policy's bit-widths (weight scales set, activation ranges still to be
    calibrated). ``int16_safe``: :func:`int16_safe_layers` on every layer (True) or on the
    named ones, before the weight scales are set. ``model`` is not modified; a bad policy
    raises UserError first.

    Examples:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        ...                             torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 10)).eval()
        >>> from hwnas.quant import quantize_model, uniform
        >>> from hwnas.quant.ptq import PTQConfig, ptq
        >>> policy = uniform(model, 8, 8)
        >>> qmodel = quantize_model(model, policy)          # fake quantization inserted, not calibrated
        >>> calibrated = ptq(model, policy, [(torch.randn(16, 1, 8, 8), None)])   # quantize + calibrate
        >>> tuple(calibrated(torch.randn(2, 1, 8, 8)).shape)
        (2, 10)
    """
    if not isinstance(policy, QuantPolicy):
        raise UserError(f"expected a QuantPolicy, got {type(policy).__name__}")
    policy.validate(model)
    if residual not in RESIDUAL_MODES:
        raise UserError(f"unknown residual mode {residual!r}; expected one of {', '.join(RESIDUAL_MODES)}")
    check_bits(add_bits, "residual-add activation", "<residual adds>")
    if any(isinstance(m, (*QUANT_LAYER_TYPES, SharedAddQuant, QuantMatMul)) for m in model.modules()):
        raise UserError(f"{type(model).__name__} is already quantized; apply a policy to the float model")
    qmodel = fold_bn(model, example_input)
    modules = list(qmodel.named_modules())
    follows = product_sources(
        (name, "conv" if isinstance(m, nn.Conv2d) else "linear" if isinstance(m, nn.Linear)
         else "matmul" if isinstance(m, MatMul) else "") for name, m in modules)
    for name, module in modules:
        if name in follows and policy[follows[name]][1] < FLOAT_BITS:
            _set_module(qmodel, name, QuantMatMul.from_float(
                module, policy[follows[name]][1], follows[name], _model_device(qmodel)))
            continue
        if name not in policy:
            continue
        w_bits, a_bits = policy[name]
        if isinstance(module, nn.Conv2d):
            _set_module(qmodel, name, QuantConv2d.from_float(module, w_bits, a_bits))
        elif isinstance(module, nn.Linear):
            _set_module(qmodel, name, QuantLinear.from_float(module, w_bits, a_bits))
    if residual == "shared":
        qmodel = insert_shared_add_quant(qmodel, add_bits)
    if int16_safe is not False:
        int16_safe_layers(qmodel, None if int16_safe is True else int16_safe)
    set_weight_scales(qmodel, weight_observer, mse_grid)
    return qmodel.eval()


# -- calibration data ------------------------------------------------------------------------------

def _batch_input(batch) -> torch.Tensor:
    x = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    if not isinstance(x, torch.Tensor):
        raise UserError(f"calibration batches must be tensors or (inputs, labels) pairs, got "
                        f"{type(x).__name__}")
    return x


def calibration_batches(batches: Iterable, max_images: int, device: torch.device | str,
                        batch_size: int | None = None) -> list[torch.Tensor]:
    """Up to ``max_images`` inputs from ``batches`` (tensors or ``(x, y)`` pairs), on ``device``,
    re-cut into batches of ``batch_size`` (default: as given; fewer, larger batches make the
    layer-by-layer passes of bias correction cheaper). UserError if there are none or the
    shapes disagree."""
    out: list[torch.Tensor] = []
    seen = 0
    for batch in batches:
        x = _batch_input(batch)
        if x.dim() == 0 or x.shape[0] == 0:
            continue
        if not torch.is_floating_point(x):
            raise UserError(f"calibration inputs must be float tensors (normalised images), got "
                            f"{x.dtype}")
        if out and x.shape[1:] != out[0].shape[1:]:
            raise UserError(f"calibration batches disagree in shape: {tuple(out[0].shape[1:])} "
                            f"then {tuple(x.shape[1:])} (per sample)")
        take = min(x.shape[0], max_images - seen)
        out.append(x[:take].to(device))
        seen += take
        if seen >= max_images:
            break
    if not out:
        raise UserError("calibration data is empty; expected an iterable of (images, labels) "
                        "batches holding at least one image")
    if batch_size is not None and len(out) > 1:
        out = list(torch.cat(out).split(batch_size))
    return out


def _check_input(model: nn.Module, x: torch.Tensor) -> None:
    """Run one sample through the model; a shape it cannot take becomes a one-line UserError."""
    try:
        with torch.no_grad():
            model(x[:1])
    except (RuntimeError, ValueError, IndexError) as exc:
        raise UserError(f"calibration batch of shape {tuple(x.shape)} does not fit the model "
                        f"(expected (N, C, H, W) inputs like its training images): "
                        f"{first_line(exc)}") from None


# -- calibration -----------------------------------------------------------------------------------

def _act_quant_sites(model: nn.Module) -> list[tuple[str, FakeQuantize, nn.Module, int | None]]:
    """``(name, activation quantizer, module, input index)`` of every activation quantizer: a
    layer's or a shared add's ``input_quant`` observes all inputs (index None), a product's
    ``a_quant``/``b_quant`` its first/second input."""
    sites: list[tuple[str, FakeQuantize, nn.Module, int | None]] = []
    for n, m in model.named_modules():
        if isinstance(m, (*QUANT_LAYER_TYPES, SharedAddQuant)):
            sites.append((n, m.input_quant, m, None))
        elif isinstance(m, QuantMatMul):
            sites += [(f"{n}.a_quant", m.a_quant, m, 0), (f"{n}.b_quant", m.b_quant, m, 1)]
    return sites


@torch.no_grad()
def calibrate(qmodel: nn.Module, batches: Iterable, config: PTQConfig | None = None) -> nn.Module:
    """Set the activation ranges of ``qmodel`` (from :func:`quantize_model`) from calibration
    data, then (if configured) correct its biases. Modifies and returns ``qmodel``."""
    config = config or PTQConfig()
    config.validate()
    device = _model_device(qmodel)
    xs = calibration_batches(batches, config.max_images, device, config.batch_size)
    set_quantizers_enabled(qmodel, False)
    try:
        _check_input(qmodel, xs[0])
    except UserError:
        set_quantizers_enabled(qmodel, True)
        raise
    per_update = max(1, config.max_samples // len(xs))
    sites = _act_quant_sites(qmodel)
    observers = {name: ActivationObserver(per_update, seed=config.seed + i,
                                          keep_sample=config.act_observer != "minmax")
                 for i, (name, *_) in enumerate(sites)}
    handles = []
    # with one calibration batch, the float pass below is exactly bias correction's float pass
    # (same model, quantizers off, same input): record its per-channel means here, once
    float_means: dict[str, torch.Tensor] | None = None
    if config.bias_correction and len(xs) == 1:
        float_means = {}
        handles += [m.register_forward_hook(_recorder(float_means, n))
                    for n, m in quant_layers(qmodel)]
    for name, q, module, index in sites:
        if q.is_float:
            continue

        def hook(_m, inputs, _name=name, _index=index):
            yield_point()
            # a SharedAddQuant observes both of its inputs, a product each input on its own
            for t in inputs if _index is None else inputs[_index:_index + 1]:
                if isinstance(t, torch.Tensor):
                    observers[_name].update(t)
        handles.append(module.register_forward_pre_hook(hook))
    was_training = qmodel.training
    qmodel.eval()
    try:
        for x in xs:
            yield_point()
            qmodel(x)
    finally:
        for h in handles:
            h.remove()
    for name, q, _, _ in sites:
        if q.is_float:
            continue
        obs = observers[name]
        if obs.empty:
            raise UserError(f"layer {name!r} was never run during calibration; the policy covers "
                            f"a layer the model's forward does not use")
        scale, zp = obs.qparams(q.bits, config.act_observer, percentile=config.percentile,
                                grid=config.mse_grid)
        q.set_qparams(scale, zp)
        q.numel_per_sample = obs.numel_per_sample
    set_quantizers_enabled(qmodel, True)
    if learns_rounding(qmodel, config.rounding):
        if config.bias_correction and float_means is None:
            float_means = _float_means(qmodel, xs)  # of the weights before they are rounded
        adaround(qmodel, xs, AdaRoundConfig(iterations=config.adaround_iterations,
                                            seed=config.seed))
    if config.bias_correction:
        bias_correct(qmodel, xs, float_means=float_means)
    qmodel.train(was_training)
    return qmodel


def learns_rounding(qmodel: nn.Module, rounding: str) -> bool:
    """Whether PTQ with ``rounding`` (:attr:`PTQConfig.rounding`) learns ``qmodel``'s rounding:
    "adaround-all" when it has a layer AdaRound can learn, "adaround" only when it also has
    weights below :data:`ADAROUND_BELOW_BITS` bits."""
    if not adaround_targets(qmodel):
        return False
    return rounding_learned([m.w_bits for _, m in quant_layers(qmodel)
                             if not m.weight_quant.is_float], rounding)


def rounding_learned(weight_bits: Iterable[int], rounding: str) -> bool:
    """The rule of :func:`learns_rounding` on the weight widths of a model's quantized layers
    (float ones left out): what a caller that has only the policy, not the model, can tell
    (the export orders its models by cost with it)."""
    widths = [w for w in weight_bits if w < FLOAT_BITS]
    if rounding == "nearest" or not widths:
        return False
    return rounding == "adaround-all" or any(w < ADAROUND_BELOW_BITS for w in widths)


def _channel_axis(module: nn.Module, out: torch.Tensor) -> int:
    """The output channel axis of a layer: features are last for a linear layer (also on a
    token sequence, ``(B, N, C)``), axis 1 for a convolution."""
    return out.dim() - 1 if isinstance(module, nn.Linear) or out.dim() == 1 else 1


def _channel_mean(module: nn.Module, out: torch.Tensor) -> torch.Tensor:
    axis = _channel_axis(module, out)
    return out.float().mean(dim=[d for d in range(out.dim()) if d != axis])


def _recorder(means: dict[str, torch.Tensor], name: str):  # noqa: ANN202 - a forward hook
    """A forward hook keeping the first per-channel output mean of layer ``name``."""
    def hook(module, _inp, out):
        yield_point()
        means.setdefault(name, _channel_mean(module, out))
    return hook


@torch.no_grad()
def _float_means(qmodel: nn.Module, xs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each quant layer's per-channel output mean in the float network (quantizers off) on
    all of ``xs`` as one batch: bias correction's float pass."""
    means: dict[str, torch.Tensor] = {}
    handles = [m.register_forward_hook(_recorder(means, n)) for n, m in quant_layers(qmodel)]
    set_quantizers_enabled(qmodel, False)
    try:
        qmodel(torch.cat(xs) if len(xs) > 1 else xs[0])
    finally:
        for h in handles:
            h.remove()
        set_quantizers_enabled(qmodel, True)
    return means


@torch.no_grad()
def bias_correct(qmodel: nn.Module, xs: list[torch.Tensor], *,
                 float_means: dict[str, torch.Tensor] | None = None) -> None:
    """Empirical bias correction, layer by layer in forward order (step 3 of :func:`ptq`).

    Two passes over all calibration images as one batch: a float pass records each layer's
    per-channel output mean; in the quantized pass, a hook on each layer adds the difference to
    the layer's bias *and* to its output before the next layers run, which is exactly the
    sequential algorithm (each layer corrected with the layers before it already corrected)
    at the cost of one forward pass. ``float_means``: the float pass's means already recorded
    on the same single batch (by :func:`calibrate`), which skips the float pass."""
    qmodel.eval()
    x = torch.cat(xs) if len(xs) > 1 else xs[0]
    layers = quant_layers(qmodel)
    corrected: set[str] = set()
    if float_means is None:
        float_means = _float_means(qmodel, [x])

    def correct(name):
        def hook(module, _inp, out):
            yield_point()
            if name in corrected or name not in float_means:
                return None
            corrected.add(name)
            delta = float_means[name] - _channel_mean(module, out)
            module.bias.add_(delta.to(module.bias.dtype))
            shape = [1] * out.dim()
            shape[_channel_axis(module, out)] = -1
            return out + delta.view(shape).to(out.dtype)
        return hook

    handles = [m.register_forward_hook(correct(n)) for n, m in layers]
    try:
        qmodel(x)
    finally:
        for h in handles:
            h.remove()


def ptq(model: nn.Module, policy: QuantPolicy, batches: Iterable, config: PTQConfig | None = None,
        *, example_input: torch.Tensor | None = None) -> nn.Module:
    """Post-training quantization of ``model`` under ``policy``; returns a new model in eval
    mode. ``batches``: calibration data, ``(x, y)`` pairs or tensors (e.g. a BatchLoader over
    training images without augmentation).

    1. :func:`quantize_model` validates the policy against the model, folds BatchNorm into a copy
       (:func:`hwnas.quant.fold.fold_bn`) and replaces each Conv2d/Linear by a
       QuantConv2d/QuantLinear at the policy's bit-widths; weight scales are set per channel
       right away (they need no data).
    2. :func:`calibrate` runs the float network (quantizers off) over up to ``max_images``
       calibration images, observes the input of every quantized layer and sets its activation
       range with the chosen observer (min-max, percentile, MSE); weights use min-max or per-channel
       MSE.
    3. Empirical bias correction (Nagel et al., 2019, "Data-Free Quantization", empirical variant):
       layer by layer, in network order, the mean per-channel output of the quantized network (with
       the layers before it already corrected) is compared with the float network's on the
       calibration images and the difference is added to the layer's bias. Done in one quantized
       forward pass over all calibration images as one batch (see :func:`bias_correct`), so keep
       ``max_images`` at a few hundred for large inputs.

    With ``rounding="adaround"`` and a policy with weights below 6 bits, the weights' rounding
    is learned between steps 2 and 3 (:mod:`hwnas.quant.adaround`, layer by layer on the
    calibration images; what W4A8 needs); bias correction then compares with the float
    network's original weights. A W6/W8 policy is then exactly the nearest-rounding PTQ, at its
    cost; ``"adaround-all"`` learns its rounding too (:func:`learns_rounding`).

    Runs in :func:`hwnas.core.heap.retained_heap`: AdaRound's per-step tensors and the passes'
    activations reuse freed memory instead of fresh pages (middle CIFAR-10 subnet, W4A8
    AdaRound: benchmarks/adaround_steps.md, Session 32)."""
    config = config or PTQConfig()
    config.validate()
    qmodel = quantize_model(model, policy, residual=config.residual, add_bits=config.add_bits,
                            weight_observer=config.weight_observer, mse_grid=config.mse_grid,
                            example_input=example_input, int16_safe=config.int16_safe)
    with retained_heap():
        return calibrate(qmodel, batches, config).eval()


def policy_of(qmodel: nn.Module) -> QuantPolicy:
    """The policy a quantized model was built with."""
    return QuantPolicy({n: (m.w_bits, m.a_bits) for n, m in quant_layers(qmodel)})

