"""The code-level parity diagnosis (export.code_trace): a QDQ file whose codes differ only by
rounding flips (values on a rounding boundary) is told from one with a wrong scale, and the
QDQ check lets the first pass and fails the second, naming the layer."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hwnas.export.code_trace import trace_codes
from hwnas.export.qdq.build import build_qdq
from hwnas.quant.policy import uniform
from onnx import numpy_helper


def _scaled(proto: onnx.ModelProto, node_name: str, factor: float) -> bytes:
    """``proto`` with the y_scale of QuantizeLinear ``node_name`` multiplied by ``factor``
    (its own initializer, so the DequantizeLinear after it keeps the original)."""
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    node = next(n for n in proto.graph.node if n.name == node_name)
    old = next(t for t in proto.graph.initializer if t.name == node.input[1])
    new = numpy_helper.from_array(numpy_helper.to_array(old) * np.float32(factor),
                                  f"{old.name}_traced_{factor}")
    proto.graph.initializer.append(new)
    node.input[1] = new.name
    return proto.SerializeToString()


@pytest.fixture()
def built(qdq_net, qdq_images):
    calib, test = qdq_images
    build = build_qdq(qdq_net, uniform(qdq_net, 8, 8), [calib])
    return build, build.proto(requantize=False), test


def _trace(build, data, test):
    ref = build.reference(requantize=False)
    with ref as deployed:
        return trace_codes(data, deployed, test, requant=ref.requant_points(), batch_size=16)


def test_the_exported_file_reproduces_every_code(built) -> None:
    build, proto, test = built
    trace = _trace(build, proto.SerializeToString(), test)
    assert trace.layers and not trace.differs and not trace.starts_as_flips
    assert "no activation code differs" in trace.describe()
    assert np.abs(trace.logits - trace.reference).max() < 1e-4


def test_flips_on_rounding_boundaries_are_told_from_a_wrong_scale(built) -> None:
    build, proto, test = built
    names = [n.name for n in proto.graph.node if n.op_type == "QuantizeLinear"
             and n.name.endswith("/input_q")]
    second = names[1]
    # a scale off by 1e-5: only values within ~1e-3 of a boundary change code: flips
    flips = _trace(build, _scaled(proto, second, 1.0 + 1e-5), test)
    assert flips.differs and flips.starts_as_flips and flips.unexplained is None
    assert flips.first_distance_to_half <= 1e-2
    # a scale off by 10%: codes move by whole levels where nothing upstream differed
    wrong = _trace(build, _scaled(proto, second, 1.1), test)
    assert wrong.differs and not wrong.starts_as_flips
    assert wrong.unexplained == second[1:-len("/input_q")] + ".input_quant"
    assert "nothing upstream" in wrong.describe()
