"""One conv/linear layer timed alone with onnxruntime, in float and as int8, for
:func:`hwnas.quant.device_rules.measure_int8_speedup` (the per-layer speed table of a CPU).

It lives in ``export`` because it builds and runs ONNX; ``quant`` only consumes the timings.
"""

from __future__ import annotations

from hwnas.supernet.layers import Layer

__all__ = ["OrtLayerTimer", "quantize_qdq"]


def quantize_qdq(model: bytes, *, seed: int = 0, batches: int = 4) -> bytes:
    """``model`` (float ONNX bytes, one input of fixed shape) as an int8 QDQ file:
    onnxruntime's static quantization, per-channel int8 weights, uint8 activations, calibrated
    on ``batches`` seeded normal inputs. For timing only: random calibration sets the scales,
    which do not change what the runtime executes."""
    import os
    import tempfile

    import numpy as np
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quant_pre_process,
        quantize_static,
    )

    graph = onnx.load_from_string(model).graph
    inp = graph.input[0]
    shape = tuple(d.dim_value or 1 for d in inp.type.tensor_type.shape.dim)
    rng = np.random.default_rng(seed)

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter([{inp.name: rng.standard_normal(shape).astype(np.float32)}
                               for _ in range(batches)])

        def get_next(self):  # noqa: ANN201 - onnxruntime protocol
            return next(self.items, None)

    with tempfile.TemporaryDirectory() as tmp:
        raw, src, dst = (os.path.join(tmp, f) for f in ("r.onnx", "f.onnx", "q.onnx"))
        with open(raw, "wb") as f:
            f.write(model)
        # onnxruntime's own pre-processing folds the exporter's Identity-fed biases into
        # initializers; without it 48 of an NB-201 network's 52 Convs stayed in float
        quant_pre_process(raw, src, skip_symbolic_shape=True)
        quantize_static(src, dst, _Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)
        with open(dst, "rb") as f:
            return f.read()


class OrtLayerTimer:
    """Times one conv/linear layer alone with onnxruntime on this CPU, in float and as int8
    (static QDQ quantization, per-channel int8 weights, uint8 activations), for
    :func:`measure_int8_speedup`. Needs torch and onnxruntime.quantization.

    Examples:
        >>> from hwnas.export import OrtLayerTimer
        >>> from hwnas.supernet import Layer
        >>> timer = OrtLayerTimer(repeats=3, warmup=1)
        >>> conv = Layer("conv", "conv", in_channels=16, out_channels=16, kernel=3, in_h=16, in_w=16)
        >>> timer(conv, int8=False) > 0, timer(conv, int8=True) > 0       # ms, float and int8
        (True, True)
    """

    def __init__(self, *, batch: int = 1, threads: int = 1, repeats: int = 50, warmup: int = 10,
                 seed: int = 0) -> None:
        self.batch, self.threads, self.repeats, self.warmup, self.seed = batch, threads, repeats, warmup, seed

    def _model_bytes(self, layer: Layer) -> tuple[bytes, tuple[int, ...]]:
        import torch
        from hwnas.supernet.onnx import onnx_bytes
        from torch import nn

        torch.manual_seed(self.seed)
        if layer.op == "conv":
            module = nn.Conv2d(layer.in_channels, layer.out_channels, layer.kernel, layer.stride,
                               layer.kernel // 2, groups=layer.groups, bias=layer.bias)
            shape = (self.batch, layer.in_channels, layer.in_h, layer.in_w)
        else:
            module = nn.Linear(layer.in_channels, layer.out_channels, bias=layer.bias)
            tokens = layer.in_h * layer.in_w  # a transformer's linear layer runs on every token
            shape = ((self.batch, tokens, layer.in_channels) if tokens > 1
                     else (self.batch, layer.in_channels))
        return onnx_bytes(module.eval(), torch.randn(*shape)), shape

    def __call__(self, layer: Layer, int8: bool) -> float:
        from hwnas.latency.onnx_measure import measure_onnx

        model, _shape = self._model_bytes(layer)
        if int8:
            model = quantize_qdq(model, seed=self.seed)
        stats = measure_onnx(model, batch=self.batch, warmup=self.warmup, repeats=self.repeats,
                             threads=self.threads, seed=self.seed)
        return stats.median_ms
