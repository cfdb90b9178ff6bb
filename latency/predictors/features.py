"""Architecture features shared by the predictors, computed once per architecture and cached.

Three kinds, all from the space declaration (no second encoder lives here): ``encode``, the
space's own feature vector (:meth:`SearchSpace.encode`; one-hot per edge for NAS-Bench-201, per
layer for FBNet); ``flops``, :meth:`SearchSpace.flops` of the layer list; ``layers``, per layer
kind sums over the layer list (:func:`layer_features`, which says why they predict latency).
:func:`features` returns and caches them.

**Execution variants** (:func:`execution_variants`, :func:`executed`): what a device runs need
not be the architecture as written (:meth:`SearchSpace.executed`: a runtime that eliminates dead
code runs a smaller network). Predictors evaluate their features on the executed architecture of
each variant and let the measurements decide which one a device runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
from hwnas.supernet.layers import OPS, Layer

from hwnas.core.errors import UserError

__all__ = ["LAYER_KINDS", "LAYER_QUANTITIES", "arch_strings", "encoding_positions",
           "execution_prior", "execution_variants", "executed", "export_execution", "features",
           "layer_features", "layer_feature_names", "pair_products",
           "RUNTIME_DROPS_DEAD_CODE", "runtime_execution"]

#: Layer kinds: convolutions split by shape, then every other op of :data:`hwnas.supernet.layers.OPS`.
#: The list is fixed and only ever appended to: shipped meta predictors store the indices of
#: their layer-feature columns (``l_cols``), so a kind inserted before ``other`` would shift the
#: columns of every existing space. The transformer ops came after ``other``.
LAYER_KINDS: tuple[str, ...] = ("conv_kxk", "conv_1x1", "conv_grouped", "conv_dw", "linear",
                                "avgpool", "add", "pool", "mul", "other",
                                "matmul", "layernorm", "softmax", "gelu")
_CONV_KINDS = {"conv_kxk", "conv_1x1", "conv_grouped", "conv_dw"}
if set(LAYER_KINDS) - _CONV_KINDS - {"other"} != set(OPS) - {"conv"}:
    raise ImportError("LAYER_KINDS must list every op of hwnas.supernet.layers.OPS once: append "
                      "the new op at the end of LAYER_KINDS")
#: Quantities summed per kind.
LAYER_QUANTITIES: tuple[str, ...] = ("count", "macs", "in_act", "out_act", "params")

_CACHE: dict[tuple[str, str, str], dict[str, np.ndarray]] = {}
_CANON: dict[str, dict[str, str]] = {}
_EXEC: dict[tuple[str, str], dict[str, tuple[str, float]]] = {}
_CACHE_LIMIT = 200_000  # architectures per (space, kind); beyond it the cache is reset


def layer_kind(layer: Layer) -> str:
    """The kind of a layer (see :data:`LAYER_KINDS`)."""
    if layer.op == "conv":
        if layer.groups == 1:
            return "conv_kxk" if layer.kernel > 1 else "conv_1x1"
        if layer.groups == layer.in_channels:
            return "conv_dw"
        return "conv_grouped"
    return layer.op if layer.op in LAYER_KINDS else "other"


def layer_feature_names() -> list[str]:
    return [f"{k}.{q}" for k in LAYER_KINDS for q in LAYER_QUANTITIES]


def layer_features(layers: Sequence[Layer]) -> np.ndarray:
    """Per-kind sums (kinds × quantities, flattened) of a layer list; float64.

    For each kind of :data:`LAYER_KINDS` (dense k×k conv, 1×1 conv, grouped conv, depthwise
    conv, linear, local pool, global pool, add, mul, and the transformer ops matmul, layernorm,
    softmax, gelu): the number of layers, MACs, input and output activation elements and
    parameters. Latency is close to additive over layers and each layer's cost is close to
    linear in these quantities (compute, memory traffic, a fixed per-layer overhead), so a
    device's latency is close to linear in these sums; they are what the layer-wise
    lookup-table predictor fits and a prior component of the meta-learned predictor."""
    out = np.zeros((len(LAYER_KINDS), len(LAYER_QUANTITIES)))
    for la in layers:
        k = LAYER_KINDS.index(layer_kind(la))
        out[k] += (1.0, la.macs, la.in_channels * la.in_h * la.in_w + la.second_operand,
                   la.out_channels * la.out_h * la.out_w, la.params)
    return out.reshape(-1)


def _space_key(space: Any) -> str:
    try:
        config = json.dumps(space.config(), sort_keys=True, default=str)
    except (TypeError, ValueError):
        config = repr(space.config())
    return f"{space.name}|{config}"


def arch_strings(space: Any, archs: Sequence[Any]) -> list[str]:
    """Canonical strings of ``archs`` (architectures of ``space`` or their strings); an
    architecture outside the space raises :class:`UserError`. Strings seen before are looked
    up, not parsed again (ranking a whole space calls this with thousands of strings)."""
    if isinstance(archs, str):
        raise UserError("expected a list of architectures, got a single string")
    canon = _CANON.setdefault(_space_key(space), {})
    if len(canon) > _CACHE_LIMIT:
        canon.clear()
    out = []
    for a in archs:
        if isinstance(a, str):
            c = canon.get(a)
            if c is None:
                c = canon[a] = space.to_string(space.from_string(a))
            out.append(c)
        else:
            out.append(space.to_string(space.parse(a)))
    return out


def _compute(space: Any, kind: str, arch: Any) -> np.ndarray:
    if kind == "encode":
        return np.asarray(space.encode(arch), dtype=np.float64)
    if kind == "flops":
        return np.array([float(space.flops(arch))])
    if kind == "layers":
        return layer_features(space.layers(arch))
    raise ValueError(f"unknown feature kind {kind!r}")


def features(space: Any, keys: Sequence[str], kind: str) -> np.ndarray:
    """Feature matrix (one row per canonical string in ``keys``) of ``kind`` in
    {``encode``, ``flops``, ``layers``}, cached per space (name and configuration) and
    canonical architecture string: computing ``space.layers`` for the 15,625 NAS-Bench-201
    cells takes seconds."""
    cache = _CACHE.setdefault((_space_key(space), space.name, kind), {})
    missing = [k for k in dict.fromkeys(keys) if k not in cache]
    if len(cache) + len(missing) > _CACHE_LIMIT:
        cache.clear()
    for k in missing:
        cache[k] = _compute(space, kind, space.from_string(k))
    if not keys:
        width = len(_compute(space, kind, space.smallest()))
        return np.zeros((0, width))
    return np.stack([cache[k] for k in keys])


def execution_variants(space: Any) -> tuple[str, ...]:
    """The execution variants of ``space`` (:meth:`SearchSpace.execution_variants`; ``("raw",)``
    for a candidate space without the capability)."""
    own = getattr(space, "execution_variants", None)
    return tuple(own()) if callable(own) else ("raw",)


def export_execution(space: Any) -> str:
    """The execution variant of the ONNX files hwnas exports for ``space``
    (:func:`hwnas.supernet.onnx.onnx_bytes`: ``reference --export``, ``hwnas run``): the
    exporter traces the network, so operations whose output reaches no output are not in the
    file and no runtime can run them -- ``pruned`` where the space has that variant, else
    ``raw`` (tests/test_latency_execution_pin.py checks it against exported files). The
    exporter also merges identical parameter-free operations on one input (the pools of two
    NB-201 edges leaving one node), which no variant models; they cost little."""
    variants = execution_variants(space)
    return "pruned" if "pruned" in variants else variants[0]


#: Whether a runtime drops operations whose output is unused (graph compilers do; eager
#: PyTorch, and a CUDA graph captured from it, run every operation). It holds for hwnas's
#: models (its ONNX exports, its PyTorch modules, which leave a dead operation's output
#: unused); a model built elsewhere may keep them alive (a ``none`` edge written as a
#: multiplication by zero), and then only the variant itself says how it ran.
RUNTIME_DROPS_DEAD_CODE = {
    "onnxruntime": True, "openvino": True, "tensorrt": True, "tflite": True, "litert": True,
    "torchscript": True, "pytorch-mobile": True, "executorch": True, "torch.compile": True,
    "pytorch": False, "eager": False, "cudagraph": False}


def runtime_execution(space: Any, runtime: str) -> str:
    """The execution variant a runtime of :data:`RUNTIME_DROPS_DEAD_CODE` runs hwnas's models
    of ``space`` under: the export's (:func:`export_execution`) where it drops dead code, else
    ``raw``."""
    return export_execution(space) if RUNTIME_DROPS_DEAD_CODE[runtime] else "raw"


def execution_prior(chosen: Sequence[str], variants: Sequence[str],
                    groups: Sequence[str] | None = None) -> dict[str, float]:
    """Prior probability that a new device runs each execution variant: the share of the
    meta-training devices whose profile runs it (``chosen``, one per device), Laplace-smoothed.
    With ``groups`` (a group name per device) each group weighs the same, its devices splitting
    one vote: a new device is of a family the meta-training set has not seen, so fifteen GPUs of
    one family should not outvote one CPU runtime."""
    names = list(range(len(chosen))) if groups is None else list(groups)
    size = {g: names.count(g) for g in names}
    votes = {v: sum(1.0 / size[g] for c, g in zip(chosen, names) if c == v) for v in variants}
    return {v: (votes[v] + 1.0) / (len(size) + len(variants)) for v in variants}


def executed(space: Any, keys: Sequence[str], variant: str) -> tuple[list[str], np.ndarray]:
    """Canonical strings of the networks a device runs under execution ``variant`` for the
    canonical strings ``keys``, and a float flag per architecture: 1.0 where the network's
    output is a constant under that variant (a runtime may fold it away entirely), else 0.0.
    ``raw`` returns ``keys`` unchanged with all-zero flags."""
    if variant not in execution_variants(space):
        raise UserError(f"execution variant {variant!r} does not exist for space {space.name}; "
                        f"expected one of {list(execution_variants(space))}")
    if variant == "raw":
        return list(keys), np.zeros(len(keys))
    cache = _EXEC.setdefault((_space_key(space), variant), {})
    if len(cache) > _CACHE_LIMIT:
        cache.clear()
    out, flags = [], np.zeros(len(keys))
    for i, k in enumerate(keys):
        hit = cache.get(k)
        if hit is None:
            arch, constant = space.executed(space.from_string(k), variant)
            hit = cache[k] = (space.to_string(arch), 1.0 if constant else 0.0)
        out.append(hit[0])
        flags[i] = hit[1]
    return out, flags


def encoding_positions(space: Any) -> list[np.ndarray]:
    """Column indices of each position of a ``position=choice`` one-hot encoding (NB-201: its 6
    edges; FBNet: its 22 layers)."""
    names = list(space.feature_names)
    order = list(dict.fromkeys(n.split("=", 1)[0] for n in names))
    return [np.array([k for k, n in enumerate(names) if n.split("=", 1)[0] == p]) for p in order]


def pair_products(E: np.ndarray, positions: Sequence[np.ndarray],
                  adjacent_only: bool = False) -> np.ndarray:
    """Products of the one-hot encodings of two positions (every pair of positions, or only
    neighbouring ones), one column per (choice at i, choice at j): the non-additive terms of a
    cell (an operation whose cost depends on what feeds it)."""
    n = len(positions)
    pairs = ([(i, i + 1) for i in range(n - 1)] if adjacent_only else
             [(i, j) for i in range(n) for j in range(i + 1, n)])
    cols = [(E[:, positions[i]][:, :, None] * E[:, positions[j]][:, None, :]).reshape(len(E), -1)
            for i, j in pairs]
    return np.hstack(cols) if cols else np.zeros((len(E), 0))
