"""The quantization benchmark table on a tiny ``vit`` subnet and synthetic 32x32 images: every
method runs on a transformer (Linear layers per channel, attention products quantized, the first
and last layer kept at 8 bits), and the FP32 row does not claim a BatchNorm recalibration that a
LayerNorm network never gets."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from hwnas.supernet.data.splits import DatasetSplits, ImageSplit  # noqa: E402

from benchmarks.quant_recipes import METHODS, QuantBenchConfig, run_quant_benchmark  # noqa: E402


def _split(n: int, seed: int) -> ImageSplit:
    g = torch.Generator().manual_seed(seed)
    return ImageSplit(torch.randint(0, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8),
                      torch.randint(0, 10, (n,), generator=g))


@pytest.fixture()
def synthetic() -> DatasetSplits:
    return DatasetSplits("synthetic", _split(64, 0), _split(32, 1), _split(32, 2),
                         [str(i) for i in range(10)], (0.5,) * 3, (0.25,) * 3, "crop_flip")


def test_every_method_runs_on_a_vit_subnet(vit_tiny, synthetic) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        supernet = vit_tiny.build_supernet()
        before = {k: v.clone() for k, v in supernet.state_dict().items()}
        config = QuantBenchConfig(subnets=("smallest",), calib_images=32, qat_max_steps=2,
                                  qat_batch_size=16, hessian_samples=2, hessian_images=32,
                                  eval_batch_size=32, progress=False)
        rows = run_quant_benchmark(supernet, vit_tiny, synthetic, config, log=lambda *_: None)
    finally:
        torch.set_num_threads(threads)
    by = {r["method"]: r for r in rows}
    assert [r["method"] for r in rows] == list(METHODS)
    assert by["fp32"]["recipe"] == "float subnet (no BatchNorm)"
    for method in ("ptq_int8_minmax", "ptq_int8_percentile", "ptq_int8_mse"):
        assert by[method]["avg_weight_bits"] == 8
        assert by[method]["size_bytes"] < by["fp32"]["size_bytes"] / 3
    layers = vit_tiny.layers(vit_tiny.smallest())
    weighted = [la.name for la in layers if la.op in ("conv", "linear")]
    assert 4 < by["ptq_w4a8"]["avg_weight_bits"] < 8  # first and last layer at 8 bits
    assert by["ptq_w4a8"]["size_bytes"] == by["qat_w4a8"]["size_bytes"]
    assert "2 steps" in by["qat_w4a8"]["recipe"]
    mixed = by["mixed"]["policy_bits"]
    assert set(mixed) == set(weighted)  # LayerNorm, Softmax, GELU and products take no policy
    assert by["mixed"]["avg_weight_bits"] <= 5.0 + 1e-6
    for r in rows:
        assert 0.0 <= r["top1"] <= 100.0
    assert all(torch.equal(v, supernet.state_dict()[k]) for k, v in before.items())


def test_cifar10_script_step_size_rate_follows_the_weight_rate_unless_given() -> None:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "quant_cifar10.py"
    spec = importlib.util.spec_from_file_location("quant_cifar10", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    base = ["--checkpoint", "x.pt", "--subnets", "smallest", "--methods", "fp32,qat_w4a8"]
    config = module.bench_config(module.parse_args([*base, "--qat-lr", "3e-4"]))
    assert config.qat_lr == config.qat_scale_lr == 3e-4
    assert config.subnets == ("smallest",) and config.methods == ("fp32", "qat_w4a8")
    config = module.bench_config(module.parse_args([*base, "--qat-lr", "3e-4", "--qat-scale-lr", "1e-3"]))
    assert (config.qat_lr, config.qat_scale_lr) == (3e-4, 1e-3)
