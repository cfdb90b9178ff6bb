"""``TrainConfig.regularise`` (``hwnas train --regularise``): the space's dropout and stochastic
depth on every subnet of a sandwich step (``all``) or on the largest only (``largest``,
BigNAS); the ViT supernet's ``regularise`` switch in both of its forward paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hwnas.core.errors import UserError
from hwnas.supernet import get_space
from hwnas.supernet.recipes import TrainConfig


def _cct():
    space = get_space("cct", in_channels=3, image_size=32, num_classes=10)
    torch.manual_seed(0)
    return space, space.build_supernet().train()


def test_unregularised_training_pass_draws_nothing():
    """``regularise`` False: a training-mode pass (fused attention) is deterministic and
    computes the evaluation pass; True: dropout and stochastic depth act."""
    space, supernet = _cct()
    x = torch.randn(4, 3, 32, 32)
    rng = np.random.default_rng(0)
    for arch in [space.largest(), space.smallest(), space.sample(rng)]:
        supernet.set_active(arch)
        masks = supernet.arch_masks(arch)
        supernet.regularise = True
        torch.manual_seed(1)
        a = supernet(x)
        torch.manual_seed(2)
        assert not torch.allclose(a, supernet(x)), str(arch)
        supernet.regularise = False
        plain, masked = supernet(x), supernet.forward_masked(x, masks)
        torch.testing.assert_close(supernet(x), plain, rtol=0, atol=0)
        torch.testing.assert_close(masked, plain, rtol=1e-4, atol=1e-5)
        supernet.eval()
        torch.testing.assert_close(supernet(x), plain, rtol=1e-4, atol=1e-5)
        supernet.train()
        supernet.regularise = True


def test_one_masked_graph_per_setting():
    """The masked pass still compiles once for every subnet, per ``regularise`` setting."""
    from torch._dynamo.testing import CompileCounter

    space, supernet = _cct()
    counter = CompileCounter()
    run = torch.compile(supernet.forward_masked, backend=counter, fullgraph=True)
    rng = np.random.default_rng(1)
    supernet.regularise = False
    for arch in [space.smallest(), space.largest()] + [space.sample(rng) for _ in range(3)]:
        run(torch.randn(2, 3, 32, 32), supernet.arch_masks(arch)).sum().backward()
    assert counter.frame_count == 1


@pytest.mark.parametrize("regularise, seen", [("all", [True] * 4),
                                              ("largest", [True, False, False, False])])
def test_sandwich_step_regularises_the_subnets_it_names(regularise, seen):
    from hwnas.supernet import TrainOptions, load_dataset, sandwich_config, train_supernet

    data = load_dataset("digits", seed=0)
    space = get_space("vit", in_channels=data.in_channels, image_size=data.image_size[0],
                      num_classes=data.num_classes)
    torch.manual_seed(0)
    supernet = space.build_supernet()
    flags = []
    supernet.register_forward_pre_hook(lambda module, args: flags.append(module.regularise))
    config = sandwich_config(epochs=1, batch_size=8)
    config.regularise = regularise
    train_supernet(supernet, space, data, config, TrainOptions(progress=False, max_steps=1))
    assert flags == seen   # largest, smallest, two random subnets
    assert supernet.regularise is True   # evaluation and the next step's largest


def test_setting_is_validated_and_old_records_load():
    recorded = TrainConfig().to_dict()
    del recorded["regularise"]   # files written before the option
    assert TrainConfig.from_dict(recorded).regularise == "all"
    with pytest.raises(UserError, match="regularise must be one of") as err:
        TrainConfig(regularise="smallest").validate()
    assert "\n" not in str(err.value)


def test_cli_refuses_it_for_a_standalone_network(tmp_path, capsys):
    from hwnas.cli import main

    out = tmp_path / "x"
    assert main(["train", "--space", "mbv3-tiny", "--epochs", "1", "--out", str(out),
                 "--standalone", "smallest", "--regularise", "largest", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--regularise largest applies to a supernet" in err and err.count("\n") == 1
    assert not out.exists()
