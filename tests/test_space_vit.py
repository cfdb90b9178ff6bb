"""The ``vit`` space's declaration beyond the SearchSpace contract: string form and tokens,
bad architectures and configurations, restriction, its training schedule, attention layers."""

from __future__ import annotations

import numpy as np
import pytest
from hwnas.supernet.spaces import ViTArch, ViTSpace, get_space

from hwnas.core.errors import UserError

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def space() -> ViTSpace:
    return get_space("vit")


# -- declaration ---------------------------------------------------------------------------------

def test_string_form_and_tokens(space) -> None:
    assert space.cfg.num_tokens == 64  # 32 -> 16 -> 8
    arch = space.from_string("e224_h4m2-h3m1.5-h2m1-h4m2-h4m1")
    assert arch == ViTArch(224, ((4, 2.0), (3, 1.5), (2, 1.0), (4, 2.0), (4, 1.0)))
    assert space.to_string(arch) == "e224_h4m2-h3m1.5-h2m1-h4m2-h4m1"
    assert space.from_string("e224_h4m2.0-h3m1.5-h2m1-h4m2-h4m1") == arch  # same ratio
    assert space.to_string(space.smallest()) == "e192_" + "-".join(["h2m1"] * 5)


@pytest.mark.parametrize(("text", "what"), [
    ("e200_h4m2-h4m2-h4m2-h4m2-h4m2", "embedding dimension"),
    ("e192_h4m2-h4m2", "depth"),
    ("e192_h5m2-h4m2-h4m2-h4m2-h4m2", "heads of block 0"),
    ("e192_h4m2-h4m3-h4m2-h4m2-h4m2", "mlp ratio of block 1"),
    ("h4m2-h4m2-h4m2-h4m2-h4m2", "malformed architecture"),
    ("e192_h4m2-k3e4-h4m2-h4m2-h4m2", "malformed block"),
])
def test_bad_architectures_name_the_problem(space, text: str, what: str) -> None:
    with pytest.raises(UserError, match=what):
        space.from_string(text)


def test_bad_configuration_is_a_user_error() -> None:
    with pytest.raises(UserError, match="unknown ViT space setting"):
        get_space("vit", config={"embed": 3})
    with pytest.raises(UserError, match="sorted and unique"):
        get_space("vit", config={"heads_choices": [4, 2]})
    with pytest.raises(UserError, match="must be integers"):
        get_space("vit", config={"embed_choices": [192.5]})


def test_restrict_gives_a_sub_space(space) -> None:
    sub = space.restrict({"embed": [256], "mlp_ratio": [2]})
    arch = sub.sample(np.random.default_rng(0))
    assert arch.embed == 256 and all(r == 2.0 for _, r in arch.blocks)
    assert space.parse(sub.to_string(arch)) == arch
    with pytest.raises(UserError, match="not a non-empty subset"):
        space.restrict({"heads": [5]})
    with pytest.raises(UserError, match="unknown dimension"):
        space.restrict({"kernel": [3]})
    with pytest.raises(UserError, match=r"choices for 'mlp_ratio' must be a list of numbers"):
        space.restrict({"mlp_ratio": ["two"]})
    assert space.restrict({"mlp_ratio": [2, 2.0]}).cfg.mlp_ratio_choices == (2.0,)


def test_progressive_schedule_opens_the_vit_dimensions(space) -> None:
    from hwnas.supernet.train import progressive_config

    config = progressive_config(space, 14)
    assert [s.name for s in config.stages][:2] == ["full", "mlp_ratio"]
    assert not any(s.sort_channels for s in config.stages)
    last = space.restrict(config.stages[-1].choices)
    assert last.elastic_choices() == space.elastic_choices()  # the whole space at the end
    first = space.restrict(config.stages[0].choices)
    assert first.smallest() == first.largest() == space.largest()


def test_the_space_asks_for_delayed_shrinking(space) -> None:
    """The compact-transformer recipe: DEpS with 40 % full-network epochs, AdamW, the largest
    subnet's full loss; TrivialAugment only for CIFAR-sized RGB images."""
    from hwnas.supernet.train import default_config, sandwich_config

    config = default_config(space, 10, seed=3)
    assert [(s.name, s.epochs, s.sandwich) for s in config.stages] == [
        ("full", 4, False), ("shrink", 6, True)]
    assert (config.optimizer, config.lr, config.weight_decay, config.warmup_epochs) == (
        "adamw", 5e-4, 0.05, 5.0)
    assert config.subnet_loss == "largest+mean" and config.seed == 3
    assert config.augment == "trivial_crop_flip_cutout"
    assert default_config(space, 10, lr=0.02).lr == 0.02  # the caller's setting wins
    assert default_config(space, 10, augment=None).augment == "trivial_crop_flip_cutout"
    assert [s.epochs for s in default_config(space, 10, full_fraction=0.5).stages] == [5, 5]
    # another preset drops the DEpS share; the other settings stay the space's
    other = default_config(space, 10, schedule="sandwich")
    assert [s.name for s in other.stages] == ["sandwich"] and other.optimizer == "adamw"
    digits = get_space("vit", in_channels=1, image_size=8, num_classes=10)
    assert default_config(digits, 10).augment is None  # grayscale: the dataset's own
    mbv3 = get_space("mbv3-tiny")  # the convolutional spaces keep the plain sandwich
    assert default_config(mbv3, 4, seed=1) == sandwich_config(4, seed=1)


def test_attention_layers_by_hand(space) -> None:
    """Q·Kᵀ of h heads of width d over n tokens: n·n·d·h MACs; its second operand is K."""
    arch = space.from_string("e192_h3m1.5-h2m1-h2m1-h2m1-h2m1")
    layers = {la.name: la for la in space.layers(arch)}
    n, d = 64, 64
    qk, av = layers["blocks.0.attn.qk"], layers["blocks.0.attn.av"]
    assert qk.macs == av.macs == 3 * n * n * d
    assert qk.second_operand == av.second_operand == 3 * n * d
    assert layers["blocks.0.attn.qkv"].macs == n * 192 * 3 * 3 * d
    assert layers["blocks.0.mlp.fc1"].out_channels == 288  # 192 × 1.5
    assert layers["blocks.0.norm1"].params == 2 * 192 and layers["blocks.0.norm1"].macs == 0
    assert layers["classifier"].macs == 192 * 10  # on the pooled vector
    ops = {la.op for la in space.layers(arch)}
    assert {"matmul", "layernorm", "softmax", "gelu"} <= ops
