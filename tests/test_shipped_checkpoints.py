"""Shipped supernet checkpoints (hwnas.supernet.checkpoints): a space and a dataset's class names
find their file, ``vit`` on CIFAR-10 as ``mbv3`` does, checked on a tiny vit checkpoint written
to a temporary folder (the real vit_cifar10.pt is trained on the H200)."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
from hwnas.supernet.checkpoints import (
    _HERE,
    CIFAR10_CLASSES,
    SHIPPED,
    shipped_checkpoint,
)


@pytest.fixture(scope="module")
def tiny_vit_dir(tmp_path_factory):
    """A folder holding a float16 vit supernet for CIFAR-sized input under the shipped name."""
    import torch
    from hwnas.supernet.spaces import ViTConfig, ViTSpace
    from hwnas.supernet.train import default_config, save_checkpoint

    space = ViTSpace(ViTConfig(tokenizer_channels=(8,), embed_choices=(16, 24),
                               depth_choices=(1, 2), heads_choices=(1, 2),
                               mlp_ratio_choices=(1.0, 2.0), head_dim=8))
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("shipped")
    save_checkpoint(folder / SHIPPED[("vit", CIFAR10_CLASSES)], space.build_supernet(), space,
                    dataset="cifar10", train_config=default_config(space, 2), half=True)
    return folder


def test_vit_and_mbv3_are_shipped_names_for_cifar10() -> None:
    assert SHIPPED[("vit", CIFAR10_CLASSES)] == "vit_cifar10.pt"
    assert SHIPPED[("mbv3", CIFAR10_CLASSES)] == "mbv3_cifar10.pt"
    for space in ("vit", "mbv3"):  # the package's own folder: the file if it is there
        path = _HERE / SHIPPED[(space, CIFAR10_CLASSES)]
        assert shipped_checkpoint(space, CIFAR10_CLASSES) == (path if path.is_file() else None)


def test_a_vit_checkpoint_is_found_by_space_and_classes(tiny_vit_dir) -> None:
    from hwnas.supernet.train import load_checkpoint

    found = shipped_checkpoint("vit", [c.upper() for c in CIFAR10_CLASSES], directory=tiny_vit_dir)
    assert found == tiny_vit_dir / "vit_cifar10.pt"
    space, _, payload = load_checkpoint(found)
    assert space.name == "vit" and space.input_shape == (3, 32, 32) and space.num_classes == 10
    assert payload["train_config"]["optimizer"] == "adamw"
    # another space, other classes, or a folder without the file: nothing
    assert shipped_checkpoint("mbv3", CIFAR10_CLASSES, directory=tiny_vit_dir) is None
    assert shipped_checkpoint("vit", CIFAR10_CLASSES[:9], directory=tiny_vit_dir) is None
    assert shipped_checkpoint("vit", CIFAR10_CLASSES, directory=tiny_vit_dir / "none") is None


def test_a_search_without_supernet_uses_the_shipped_one(tiny_vit_dir, tmp_path,
                                                        monkeypatch) -> None:
    """`hwnas run --space vit --dataset cifar10` takes the shipped file unless the run has its
    own supernet or --supernet names one."""
    from hwnas.search import runner

    monkeypatch.setattr(runner, "shipped_checkpoint",
                        functools.partial(shipped_checkpoint, directory=tiny_vit_dir))
    data = SimpleNamespace(classes=list(CIFAR10_CLASSES))
    cfg = SimpleNamespace(space="vit", supernet=None)
    assert runner._checkpoint_source(cfg, data, tmp_path) == tiny_vit_dir / "vit_cifar10.pt"
    given = SimpleNamespace(space="vit", supernet="mine.pt")
    assert runner._checkpoint_source(given, data, tmp_path) == "mine.pt"
    digits = SimpleNamespace(classes=[str(i) for i in range(10)])
    assert runner._checkpoint_source(cfg, digits, tmp_path) is None
