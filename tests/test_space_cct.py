"""The ``cct`` space: ``vit`` with CCT's parts (sequence pooling, positional embedding, CCT's
block norm, stochastic depth, attention dropout, dropout). Its extremes have the published CCT sizes, the
parts are off in ``vit`` (old checkpoints keep matching), the training-only parts vanish in
eval mode, and a subnet exports to a QDQ file that agrees with its fake-quant model."""

from __future__ import annotations

import pytest
from hwnas.quant.policy import product_sources, uniform
from hwnas.supernet.layers import total_params
from hwnas.supernet.spaces import CCTSpace, ViTConfig, get_space

torch = pytest.importorskip("torch")


def test_extremes_have_cct_2_and_cct_7_sizes() -> None:
    space = get_space("cct")
    assert isinstance(space, CCTSpace)
    net_s = space.build_supernet().extract(space.smallest())
    net_l = space.build_supernet().extract(space.largest())
    n_s = sum(p.numel() for p in net_s.parameters())
    n_l = sum(p.numel() for p in net_l.parameters())
    # CCT's README: CCT-2/3x2 0.28 M, CCT-7/3x2 3.85 M (its Q/K/V have no biases: 5 k fewer)
    assert 0.27e6 < n_s < 0.29e6 and 3.84e6 < n_l < 3.87e6
    # the layer list counts every parameter but the positional embedding's tokens x embed
    for arch, n in ((space.smallest(), n_s), (space.largest(), n_l)):
        assert total_params(space.layers(arch)) + space.cfg.num_tokens * arch.embed == n


def test_cct_matches_the_reference_structure_exactly() -> None:
    """CCT-2/3x2 and CCT-7/3x2 parameter for parameter (CCT's Q/K/V have no bias); CCT's
    stochastic-depth rates for the network's own depth; CCT's initialisation when a
    standalone network is trained from scratch."""
    from hwnas.supernet.train import reinitialize

    space = get_space("cct")
    supernet = space.build_supernet()
    small, large = supernet.extract(space.smallest()), supernet.extract(space.largest())
    assert sum(p.numel() for p in small.parameters()) == 283_723
    assert sum(p.numel() for p in large.parameters()) == 3_853_259
    assert small.blocks[0].attn.qkv.bias is None
    assert [b.drop_path for b in small.blocks] == [0.0, 0.1]  # CCT-2: linspace(0, 0.1, 2)
    assert large.blocks[-1].drop_path == pytest.approx(0.1)
    supernet.set_active(space.smallest())
    assert [b.drop_path for b in supernet.blocks[:2]] == [0.0, 0.1]
    net = reinitialize(large, seed=0)
    fc1 = net.blocks[0].mlp.fc1
    assert fc1.weight.std().item() == pytest.approx(0.02, rel=0.05) and not fc1.bias.any()
    conv = net.tokenizer[1].conv  # He-normal over the fan-in (64 x 3 x 3)
    assert conv.weight.std().item() == pytest.approx((2.0 / 576) ** 0.5, rel=0.05)
    assert net.pos_embed.std().item() == pytest.approx(0.2, rel=0.05)
    assert torch.equal(net.norm.weight, torch.ones(256))


def test_vit_keeps_its_configuration_and_the_cct_parts_are_off() -> None:
    vit = get_space("vit")
    assert not ({"seq_pool", "pos_embed", "cct_norm", "drop_path", "attn_drop", "qkv_bias",
                 "dropout"} & set(vit.config()))
    assert vit.build_supernet().extract(vit.largest()).blocks[0].attn.qkv.bias is not None
    assert get_space("vit", config=vit.config()).config() == vit.config()
    cct = get_space("cct")
    assert get_space("cct", config=cct.config()).config() == cct.config()
    recipe = cct.training_defaults()  # CCT's 200-epoch script (its examples/main.py)
    assert (recipe["batch_size"], recipe["lr"], recipe["weight_decay"], recipe["warmup_epochs"],
            recipe["mixup"], recipe["cutmix"], recipe["grad_clip"], recipe["augment"]) == (
        128, 5e-4, 0.03, 5.0, 0.0, 0.0, 0.0, "autoaugment_crop_flip")
    with pytest.raises(ValueError, match="drop_path"):
        ViTConfig(drop_path=1.0)


def test_training_only_parts_act_in_training_and_vanish_in_eval() -> None:
    space = get_space("cct")
    torch.manual_seed(0)
    supernet = space.build_supernet()
    net = supernet.extract(space.largest())
    x = torch.randn(8, 3, 32, 32)
    net.train()
    assert not torch.equal(net(x), net(x))  # stochastic depth and attention dropout draw anew
    net.eval()
    assert torch.equal(net(x), net(x))
    supernet.eval()
    supernet.set_active(space.largest())
    assert torch.allclose(supernet(x), net(x), atol=1e-5)


def test_dropout_is_ccts_dropout_rate_in_the_supernet_and_its_subnets() -> None:
    """CCT's ``dropout_rate`` 0.1 as its code ran for the README's 200-epoch table: on the
    tokens entering the blocks, the attention projection's output, the MLP's hidden units and
    its output; training only, the same masks in the supernet and its extracted subnet, and
    a configuration stored before it existed loads with it off."""
    from dataclasses import replace

    assert get_space("cct").cfg.dropout == 0.1
    old = {k: v for k, v in get_space("cct").config().items() if k != "dropout"}
    assert get_space("cct", config=old).cfg.dropout == 0.0
    with pytest.raises(ValueError, match="dropout"):
        ViTConfig(dropout=1.0)
    only = CCTSpace(replace(get_space("cct").cfg, drop_path=0.0, attn_drop=0.0, dropout=0.3))
    supernet = only.build_supernet()
    net = supernet.extract(only.largest())
    assert net.drop == net.blocks[0].attn.proj_drop == net.blocks[0].mlp.drop == 0.3
    x = torch.randn(4, 3, 32, 32)
    net.train()
    supernet.train()
    torch.manual_seed(5)
    a = net(x)
    torch.manual_seed(5)
    b = supernet(x)
    assert torch.allclose(a, b, atol=1e-5) and not torch.equal(a, net(x))
    off = CCTSpace(replace(only.cfg, dropout=0.0)).build_supernet()
    off.load_state_dict(supernet.state_dict())
    off.train()
    assert torch.equal(off(x), off(x))  # nothing else draws: dropout made the difference
    net.eval()
    assert torch.equal(net(x), net(x))


def test_resumed_run_keeps_the_space_configuration_it_started_with(tmp_path, monkeypatch):
    """A run started before a space's default changed (here: ``cct`` without dropout)
    resumes with the configuration its run.json records, as it keeps its training one."""
    from dataclasses import replace

    import hwnas.supernet.spaces as spaces
    from hwnas.cli import main

    out = tmp_path / "run"
    monkeypatch.setattr(spaces, "CCT_CONFIG", replace(spaces.CCT_CONFIG, dropout=0.0))
    assert main(["train", "--space", "cct", "--standalone", "smallest", "--epochs", "1",
                 "--limit-train", "128", "--batch-size", "64", "--out", str(out), "--quiet",
                 "--max-minutes", "0.0001"]) == 0
    monkeypatch.undo()
    assert get_space("cct").cfg.dropout == 0.1
    assert main(["train", "--out", str(out), "--resume", "--quiet"]) == 0
    saved = torch.load(out / "model.pt", weights_only=False)
    assert "dropout" not in saved["space_config"]


def test_sequence_pooling_product_follows_its_score_layer() -> None:
    space = get_space("cct")
    layers = space.layers(space.smallest())
    names = [la.name for la in layers]
    assert names.index("pos_add") < names.index("blocks.0.norm1")
    assert names[-4:] == ["attention_pool", "pool_softmax", "pool", "classifier"]
    assert product_sources(layers)["pool"] == "attention_pool"


def test_cct_subnet_exports_to_a_qdq_file_that_agrees_with_its_fake_quant_model() -> None:
    pytest.importorskip("onnxruntime")
    from hwnas.export.onnx_export import check_parity
    from hwnas.export.qdq import build_qdq

    space = CCTSpace(ViTConfig(tokenizer_channels=(8,), embed_choices=(16, 24),
                               depth_choices=(1, 2), heads_choices=(1, 2),
                               mlp_ratio_choices=(1.0, 2.0), head_dim=8, seq_pool=True,
                               pos_embed=True, cct_norm=True, drop_path=0.1, attn_drop=0.1,
                               qkv_bias=False))
    torch.manual_seed(0)
    model = space.build_supernet().extract(space.largest())
    images = torch.randn(64, *space.input_shape, generator=torch.Generator().manual_seed(1))
    built = build_qdq(model, uniform(model, 8, 8), [images[:32]])
    data = built.proto(requantize=True).SerializeToString()
    with built.reference(requantize=True) as ref:
        exact = check_parity(data, ref, images[32:], atol=float("inf"))
    assert exact.top1_agreement >= 0.99 and exact.max_abs_diff < 1e-3


def test_standalone_training_with_the_stochastic_parts_resumes_exactly(two_step_digits, tmp_path):
    """Stochastic depth, attention dropout and MixUp/CutMix draw from the RNG state the
    checkpoint keeps: 2 epochs in one go == 3 steps, a fresh process, the rest."""
    from hwnas.supernet.train import reinitialize, standalone_config, train_standalone
    from train_support import same_weights

    space = get_space("cct", in_channels=1, image_size=8, num_classes=10)
    arch = space.smallest()

    def fresh():
        torch.manual_seed(0)
        return reinitialize(space.build_supernet().extract(arch).train(), seed=1)

    config = standalone_config(2, batch_size=64, lr=1e-3, optimizer="adamw", mixup=0.8,
                               cutmix=1.0, warmup_epochs=0.5)
    ref = fresh()
    train_standalone(ref, two_step_digits, config=config, progress=False)
    ckpt = tmp_path / "s.pt"
    m = fresh()
    train_standalone(m, two_step_digits, config=config, space=space, arch=arch, progress=False,
                     checkpoint_path=ckpt, max_steps=3)
    assert not same_weights(m, ref)
    m = fresh()
    train_standalone(m, two_step_digits, config=config, space=space, arch=arch, progress=False,
                     checkpoint_path=ckpt, resume_from=ckpt)
    assert same_weights(m, ref)
