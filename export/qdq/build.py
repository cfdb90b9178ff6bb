"""The model-level entry point: :func:`build_qdq` quantizes a float model under a policy with
PTQ, maps its layers onto the exported float graph and returns a :class:`QdqBuild` that writes
the QDQ graph and its metadata. Also the plain float graph (:func:`float_proto`)."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import onnx
import torch
from hwnas.export.integer_ops import ElementwiseRewrite
from hwnas.export.onnx_export import onnx_bytes, set_metadata
from hwnas.export.passes import no_tf32
from hwnas.export.qdq.builder import LayerQuant, ProductQuant, QdqGraphBuilder
from hwnas.export.qdq.names import layer_kinds, map_layer_nodes, node_scope, weight_axis
from hwnas.export.qdq.requant import DeployedReference, calibrate_requant
from hwnas.quant.fake_quant import (
    QUANT_LAYER_TYPES,
    QuantMatMul,
    SharedAddQuant,
    quant_layers,
    quant_products,
)
from hwnas.quant.fold import fold_bn
from hwnas.quant.policy import FLOAT_BITS, QuantPolicy
from hwnas.quant.ptq import PTQConfig, calibration_batches, int16_safe_layers, policy_of, ptq
from onnx import numpy_helper
from torch import nn

from hwnas.core.errors import UserError

__all__ = ["EXPORT_FORMAT", "QdqBuild", "build_qdq", "dequantized_twin", "float_proto"]

EXPORT_FORMAT = "hwnas-export-1"


# -- float graphs ----------------------------------------------------------------------------------

def float_proto(model: nn.Module, example: torch.Tensor, *, opset: int = 17,
                fold: bool = True) -> onnx.ModelProto:
    """The float ONNX graph of ``model`` (BatchNorm folded first when ``fold``, so weight
    initializers keep their module names): input ``input``, output ``logits``, dynamic batch."""
    if fold:
        model = fold_bn(model, example)
    return onnx.load_from_string(onnx_bytes(model, example, opset=opset))


def dequantized_twin(qmodel: nn.Module) -> nn.Module:
    """A plain float copy of a fake-quant model: each QuantConv2d/QuantLinear becomes an
    ``nn.Conv2d``/``nn.Linear`` with the same (folded, bias-corrected) float weights and bias,
    each QuantMatMul a plain product."""
    from hwnas.supernet.nn.vit import MatMul

    twin = copy.deepcopy(qmodel).cpu().float().eval()
    for name, m in list(twin.named_modules()):
        if isinstance(m, SharedAddQuant):
            raise UserError("the QDQ exporter needs float residual adds "
                            "(PTQConfig.residual='float'); got a model with shared-scale adds")
        if isinstance(m, QuantMatMul):
            parent_name, _, child = name.rpartition(".")
            parent = twin.get_submodule(parent_name) if parent_name else twin
            setattr(parent, child, MatMul(m.transpose_b, m.scale))
            continue
        if not isinstance(m, QUANT_LAYER_TYPES):
            continue
        if isinstance(m, nn.Conv2d):
            plain: nn.Module = nn.Conv2d(m.in_channels, m.out_channels, m.kernel_size, m.stride,
                                         m.padding, m.dilation, m.groups, True, m.padding_mode)
        else:
            plain = nn.Linear(m.in_features, m.out_features, True)
        with torch.no_grad():
            plain.weight.copy_(m.weight)
            plain.bias.copy_(m.bias)
        parent_name, _, child = name.rpartition(".")
        parent = twin.get_submodule(parent_name) if parent_name else twin
        setattr(parent, child, plain.eval())
    return twin


def _fq_weight_ints(w: np.ndarray, scale: np.ndarray, axis: int, qmin: int, qmax: int) -> np.ndarray:
    """The integers of torch's per-channel fake quantization of ``w`` (bit-exact with the
    fake-quant model: the same kernel computes them)."""
    wt = torch.from_numpy(np.array(w, dtype=np.float32, copy=True))
    st = torch.from_numpy(scale.astype(np.float32))
    fq = torch.fake_quantize_per_channel_affine(wt, st, torch.zeros_like(st, dtype=torch.int32),
                                                axis, qmin, qmax)
    shape = [1] * wt.dim()
    shape[axis] = -1
    return torch.round(fq / st.view(shape)).clamp(qmin, qmax).to(torch.int8).numpy()


# -- the model-level entry point -------------------------------------------------------------------

@dataclass
class QdqBuild:
    """A float model quantized by :func:`hwnas.quant.ptq.ptq` under a policy, ready to be written as
    QDQ ONNX (:meth:`proto`) and checked against its fake-quant model (``qmodel``).

    ``policy`` is the effective policy (the layers of ``float_layers`` at 32 bits);
    ``searched_policy`` the one asked for."""

    qmodel: nn.Module
    policy: QuantPolicy
    searched_policy: QuantPolicy
    builder: QdqGraphBuilder
    layers: dict[str, LayerQuant]
    float_layers: list[str] = field(default_factory=list)
    kinds: dict[str, str] = field(default_factory=dict)
    #: policy layers the ONNX graph does not contain (dead code: they never affect the output)
    dead_layers: list[str] = field(default_factory=list)
    #: ``{layer: grid bits}`` of the layers whose weights sit on a narrower grid than their
    #: width so that no x86 integer kernel can saturate (:func:`int16_safe_layers`)
    narrowed: dict[str, int] = field(default_factory=dict)

    def proto(self, *, requantize: bool = True, int4: bool = False,
              extra_float: Iterable[str] = ()) -> onnx.ModelProto:
        """The QDQ graph, its quantization facts in ``metadata_props`` (:meth:`metadata`).
        ``extra_float``: more layers kept float, for timing variants only (the weights of those
        layers are still the PTQ model's)."""
        rewrite = None
        if requantize:  # built once: the graph and what its rewrite changed (for the metadata)
            rewrite = self.builder.rewrite(float_layers=set(extra_float), int4=int4)
            proto = rewrite.proto
        else:
            proto = self.builder.build(float_layers=set(extra_float), requantize=False, int4=int4)
        if not extra_float:
            from hwnas.export.qdq.int16 import int16_report

            meta = self.metadata(requantized=requantize, rewrite=rewrite)
            meta["int16"] = int16_report(proto)
            if int4 and any(self.layers[n].w_bits <= 4 for n in self.integer_layers()):
                meta["weight_storage"] = ("ONNX INT4 (opset 21) for weights of <= 4 bits, int8 "
                                          "containers for the others")
            set_metadata(proto, meta)
        return proto

    def integer_layers(self, extra_float: Iterable[str] = ()) -> list[str]:
        chosen = self.builder.integer_layers(extra_float)
        return [n for n in self.builder.node_of if n in chosen]

    def integer_products(self, extra_float: Iterable[str] = ()) -> list[str]:
        """Attention products of two activations that run as integer kernels."""
        return self.builder.integer_products(extra_float)

    def kernel_nodes(self) -> dict[str, str]:
        """``{layer or product: source node}``: what :func:`hwnas.export.ort_profile.
        integer_kernel_check` looks for after onnxruntime's optimizations."""
        return {**self.builder.node_of, **{n: node for n, (node, _) in self.builder.products.items()}}

    def requant_layers(self, *, requantize: bool = True) -> list[str]:
        return self.builder.requant_layers() if requantize else []

    def reference(self, *, requantize: bool = True) -> DeployedReference:
        """Context manager: the fake-quant model as the QDQ graph of :meth:`proto` computes it
        (int32 biases, and the requantization points when ``requantize``): the graph without
        ``extra_float``, whose layers this model still quantizes (timing variants have no
        reference; :func:`hwnas.export.verify.verify_qdq` refuses a file of another graph)."""
        return DeployedReference(self.qmodel, self.layers, self.builder.int32_bias_layers(),
                                 self.builder.requant_layers() if requantize else (),
                                 self.builder.rewrite() if requantize else None)

    def metadata(self, *, requantized: bool = True,
                 rewrite: ElementwiseRewrite | None = None) -> dict[str, Any]:
        """Quantization facts for ``metadata_props``: effective and searched policy, true weight
        widths, the layers kept float for speed and the requantized ones, and how many
        element-wise ops run as integer kernels (from ``rewrite``, the graph's
        :meth:`QdqGraphBuilder.rewrite`; built here when not given)."""
        if requantized and rewrite is None:
            rewrite = self.builder.rewrite()
        return {
            "policy": self.policy.to_dict(),
            "searched_policy": self.searched_policy.to_dict(),
            "weight_bits": {n: lq.w_bits for n, lq in self.layers.items()},
            "weight_grid_bits": dict(self.narrowed),
            "activation_bits": {n: lq.a_bits for n, lq in self.layers.items()},
            "float_for_speed": list(self.float_layers),
            "integer_products": self.builder.integer_products(),
            "dead_layers": list(self.dead_layers),
            "requantized_layers": self.builder.requant_layers() if requantized else [],
            "integer_elementwise": ({"hswish": len(rewrite.hswish), "se_gates": len(rewrite.gates),
                                     "residual_adds": len(rewrite.residual)}
                                    if requantized else {}),
            "bias": ("int32 on input_scale * weight_scale for integer Conv/Gemm layers; float, "
                     "added after the integer product, for MatMul (token-sequence linear) layers"),
            "weight_storage": "int8 containers (values on each layer's w_bits grid)",
        }


def _on_cpu(model: nn.Module) -> nn.Module:
    for p in model.parameters():
        if p.device.type != "cpu":
            return copy.deepcopy(model).cpu()
        break
    return model


def _given_quantized(quantized: nn.Module, policy: QuantPolicy,
                     float_layers: Iterable[str],
                     int16_safe: bool | tuple[str, ...] = False) -> nn.Module:
    """A CPU copy of an already quantized model, checked to be quantized under ``policy``,
    with the quantizers of ``float_layers`` made the identity; with ``int16_safe``, the weights
    that could saturate a 16-bit pair sum moved to the narrower grid at the same clipping
    range (scale times ``qmax / narrow qmax``)."""
    if not quant_layers(quantized):
        raise UserError("the quantized model given to the QDQ exporter has no quantized layer")
    if policy_of(quantized).bits != policy.bits:
        raise UserError("the quantized model given to the QDQ exporter was quantized under "
                        "another policy than the one given")
    qmodel = copy.deepcopy(quantized).cpu().float().eval()
    floats = set(float_layers)
    for name in floats:
        layer = qmodel.get_submodule(name)
        layer.weight_quant.bits = layer.input_quant.bits = FLOAT_BITS
    for _, product in quant_products(qmodel):  # a product follows its projection's bits
        if product.follows in floats:
            product.a_quant.bits = product.b_quant.bits = FLOAT_BITS
    if int16_safe is not False:
        full = {name: layer.weight_quant.qmax for name, layer in quant_layers(qmodel)}
        for name in int16_safe_layers(qmodel, None if int16_safe is True else int16_safe):
            wq = qmodel.get_submodule(name).weight_quant
            scale, zp, _, qmax = wq.qparams()
            wq.set_qparams(scale * (full[name] / qmax), zp)
    return qmodel


def build_qdq(model: nn.Module, policy: QuantPolicy, calibration: Iterable, *,
              config: PTQConfig | None = None, example: torch.Tensor | None = None,
              float_layers: Iterable[str] = (), opset: int = 17,
              requant_observer: str = "mse", quantized: nn.Module | None = None,
              device: str | torch.device = "cpu", portable: bool = True) -> QdqBuild:
    """Quantize ``model`` (float, BatchNorm not yet folded) under ``policy`` with PTQ on
    ``calibration`` (``(x, y)`` batches or tensors) and prepare its QDQ graph.

    ``quantized``: a fake-quant model already quantized under ``policy`` (e.g. by QAT), taken
    as it is instead of running PTQ: its learned (LSQ) weight and activation scales go into the
    graph unchanged, and ``calibration`` only places the requantization points. ``model`` is
    then its float equivalent (:func:`dequantized_twin`); ``float_layers`` are made float in a
    copy of it (their quantizers become the identity; no bias correction re-runs).

    ``float_layers``: layers to keep in float although the policy quantizes them (the per-device
    choice); PTQ runs with them at 32 bits, so bias correction sees the model as exported.
    ``requant_observer``: how the requantization points' ranges are chosen (minmax | percentile
    | mse; MSE keeps the ONNX model's CIFAR-10 accuracy within ~0.5 points of the fake-quant
    model's where min-max loses 1.5). Raises UserError for a policy that does not match the
    model, a layer that cannot be mapped to an ONNX node, or unusable calibration data.

    ``portable`` (default): weights of the layers whose integer products could saturate a
    16-bit pair sum on x86 CPUs without VNNI (AVX2, AVX-512 without VNNI) on a grid one bit
    narrower (W8A8: [-63, 63] in int8; :func:`hwnas.quant.ptq.int16_safe_layers`), so the file
    computes the same on every x86 ISA; PTQ and bias correction see those weights. False: the
    full grid (faster to nothing, exact only on VNNI/AMX CPUs, or with onnxruntime's
    ``session.x64quantprecision=1``). A ``config.int16_safe`` already set is kept.

    ``device``: torch device of the calibration passes (PTQ's ranges, bias correction, the
    requantization points; TF32 off). The returned build's fake-quant model is on the CPU, and
    every check compares the graph with that model, wherever its ranges were computed.

    Examples:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        ...                             torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 10)).eval()
        >>> from hwnas.export import build_qdq
        >>> from hwnas.quant import uniform
        >>> built = build_qdq(model, uniform(model, 8, 8), [(torch.randn(16, 1, 8, 8), None)])
        >>> onnx_model = built.proto()           # the QDQ graph (an onnx.ModelProto)
        >>> sorted(built.policy.bits)
        ['0', '4']
    """
    if not isinstance(policy, QuantPolicy):
        raise UserError(f"expected a QuantPolicy, got {type(policy).__name__}")
    config = config or PTQConfig()
    if portable and config.int16_safe is False:
        config = replace(config, int16_safe=True)
    config.validate()
    model = _on_cpu(model).eval()
    policy.validate(model)
    float_layers = list(dict.fromkeys(float_layers))
    unknown = [n for n in float_layers if n not in policy]
    if unknown:
        raise UserError(f"cannot keep layer {unknown[0]!r} in float: the policy has no such layer")
    effective = policy.with_bits({n: (FLOAT_BITS, FLOAT_BITS) for n in float_layers})
    calib_device = torch.device(device)
    xs = calibration_batches(calibration, config.max_images, calib_device, config.batch_size)
    if example is None:
        example = xs[0][:1]
    example = example.cpu()
    if quantized is None:
        on_device = model if calib_device.type == "cpu" else copy.deepcopy(model).to(calib_device)
        with no_tf32():
            qmodel = ptq(on_device, effective, xs, config,
                         example_input=example.to(calib_device))
    else:
        qmodel = _given_quantized(quantized, policy, float_layers,
                                  int16_safe=config.int16_safe).to(calib_device)
    twin = dequantized_twin(qmodel)
    proto = onnx.load_from_string(onnx_bytes(twin, example[:1], opset=opset))
    # the policy matches the model (validated above), so a layer without a node is dead code
    # the exporter removed - unless its weights are in the graph after all
    node_of = map_layer_nodes(proto, effective.layer_names, allow_missing=True)
    nodes = {n.name: n for n in proto.graph.node}
    inits = {i.name: i for i in proto.graph.initializer}
    dead = [n for n in effective.layer_names if n not in node_of]
    unmapped = [n for n in dead if f"{n}.weight" in inits]
    if unmapped:
        raise UserError(f"layer {unmapped[0]!r} has weights in the ONNX graph but no "
                        f"Conv/Gemm/MatMul node that maps to it; cannot quantize it")
    kinds = layer_kinds(model)
    layers: dict[str, LayerQuant] = {}
    for name, module in quant_layers(qmodel):
        if name not in node_of:
            continue  # dead: it does not run in the exported graph
        node = nodes[node_of[name]]
        lq = LayerQuant(name, kinds.get(name, "conv"), module.w_bits, module.a_bits)
        if lq.w_bits < FLOAT_BITS:
            axis = weight_axis(node)
            w = numpy_helper.to_array(inits[node.input[1]])
            torch_w = module.weight.detach().cpu().float().numpy()
            as_torch = w.T if axis == 1 and w.ndim == 2 else w
            if as_torch.shape != torch_w.shape or not np.array_equal(as_torch, torch_w):
                raise UserError(f"ONNX node {node.name!r} does not hold the weights of layer "
                                f"{name!r}; cannot quantize it")
            scale, _, qmin, qmax = module.weight_quant.qparams()
            lq.weight_scale = scale.detach().cpu().float().numpy().reshape(-1)
            lq.weight_axis = axis
            lq.weight_int = _fq_weight_ints(w, lq.weight_scale, axis, qmin, qmax)
        if lq.a_bits < FLOAT_BITS:
            scale, zp, _, _ = module.input_quant.qparams()
            lq.act_scale = float(scale.reshape(-1)[0])
            lq.act_zero_point = int(zp.reshape(-1)[0])
        layers[name] = lq
    modules = {name: ("hswish" if isinstance(m, nn.Hardswish) else
                      "hsigmoid" if isinstance(m, nn.Hardsigmoid) else "")
               for name, m in qmodel.named_modules() if name}
    products = _product_nodes(proto, qmodel)
    builder = QdqGraphBuilder(proto, node_of, layers, modules, products)
    from hwnas.quant.observers import ACT_OBSERVERS

    if requant_observer not in ACT_OBSERVERS:
        raise UserError(f"unknown requantization observer {requant_observer!r}; expected one of "
                        f"{', '.join(ACT_OBSERVERS)}")
    with no_tf32():
        calibrate_requant(layers, builder, qmodel, xs, config, requant_observer)
    qmodel = qmodel.cpu()
    narrowed = {name: m.weight_quant.grid_bits for name, m in quant_layers(qmodel)
                if name in layers and m.weight_quant.grid_bits is not None}
    return QdqBuild(qmodel, effective, policy, builder, layers, float_layers, kinds, dead,
                    narrowed)


def _product_nodes(proto: onnx.ModelProto, qmodel: nn.Module
                   ) -> dict[str, tuple[str, ProductQuant]]:
    """``{product: (MatMul node, parameters)}`` of every quantized product of ``qmodel``, its
    node found by scope (``/blocks/blocks.0/attn/qk/MatMul`` -> ``blocks.0.attn.qk``)."""
    inits = {i.name for i in proto.graph.initializer}
    by_scope: dict[str, list[str]] = {}
    for node in proto.graph.node:
        if node.op_type == "MatMul" and not any(i in inits for i in node.input):
            by_scope.setdefault(node_scope(node.name), []).append(node.name)
    out: dict[str, tuple[str, ProductQuant]] = {}
    for name, module in quant_products(qmodel):
        if module.a_quant.is_float:
            continue
        found = by_scope.get(name, [])
        if len(found) != 1:
            raise UserError(f"product {name!r} maps to {len(found)} MatMul nodes of two "
                            f"activations in the ONNX graph, expected one")
        qparams = []
        for q in (module.a_quant, module.b_quant):
            scale, zp, _, _ = q.qparams()
            qparams.append((float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0])))
        out[name] = (found[0], ProductQuant(name, module.follows, module.a_bits, tuple(qparams)))
    return out
