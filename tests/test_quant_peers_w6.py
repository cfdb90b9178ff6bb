"""benchmarks/quant_peers.py's W6A8 methods: the W4A8 recipe with 6-bit weights (first and
last layer W8A8), nearest or AdaRound."""

from __future__ import annotations

from benchmarks.quant_peers import METHODS, hwnas_build, rounding_of


def test_w6a8_methods_keep_first_and_last_layer_8_bit(qdq_net, qdq_images):
    calib, _ = qdq_images
    assert {"hwnas_w6a8", "hwnas_w6a8_adaround"} <= set(METHODS)
    assert rounding_of("hwnas_w6a8") == "nearest"
    assert rounding_of("hwnas_w6a8_adaround") == "adaround-all"  # "adaround" leaves W6 files
    assert rounding_of("hwnas_w4a8_adaround") == "adaround"
    build = hwnas_build(qdq_net, calib[:16], "hwnas_w6a8")
    names = list(build.searched_policy.layer_names)
    bits = [build.searched_policy[n] for n in names]
    assert bits[0] == bits[-1] == (8, 8)
    assert all(b == (6, 8) for b in bits[1:-1]) and len(bits) > 2
