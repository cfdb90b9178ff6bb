"""Shipped supernet checkpoints (hwnas.supernet.checkpoints): a space and a dataset's class names
find their file, ``vit`` on CIFAR-10 as ``mbv3`` does, checked on a tiny vit checkpoint written
to a temporary folder (the real vit_cifar10.pt is trained on the H200). ``vit`` prefers the
shipped ``cct`` supernet (a variant of its family, issue 44): a search with ``--space vit`` then
runs, records, exports and continues in space ``cct``."""

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
    save_checkpoint(folder / "vit_cifar10.pt", space.build_supernet(), space,
                    dataset="cifar10", train_config=default_config(space, 2), half=True)
    return folder


def test_vit_and_mbv3_are_shipped_names_for_cifar10() -> None:
    assert SHIPPED[("vit", CIFAR10_CLASSES)] == ("cct_cifar10.pt", "vit_cifar10.pt")
    assert SHIPPED[("cct", CIFAR10_CLASSES)] == ("cct_cifar10.pt",)
    assert SHIPPED[("mbv3", CIFAR10_CLASSES)] == ("mbv3_cifar10.pt",)
    for space in ("vit", "mbv3", "cct"):  # the package's own folder: the first file there
        present = [_HERE / n for n in SHIPPED[(space, CIFAR10_CLASSES)] if (_HERE / n).is_file()]
        assert shipped_checkpoint(space, CIFAR10_CLASSES) == (present[0] if present else None)


def test_a_variant_names_its_family() -> None:
    from hwnas.supernet.spaces import CCTSpace, get_space

    assert CCTSpace.family == "vit" and get_space("cct").family == "vit"
    assert get_space("vit").family == "vit" and get_space("mbv3").family == "mbv3"


def test_the_first_candidate_present_is_used(tiny_vit_dir, tmp_path) -> None:
    """``vit`` takes cct_cifar10.pt once it is there, its own file until then; ``cct`` only
    its own."""
    import shutil

    folder = tmp_path / "pkg"
    folder.mkdir()
    assert shipped_checkpoint("vit", CIFAR10_CLASSES, directory=folder) is None
    shutil.copy(tiny_vit_dir / "vit_cifar10.pt", folder / "vit_cifar10.pt")
    assert shipped_checkpoint("vit", CIFAR10_CLASSES, directory=folder) == folder / "vit_cifar10.pt"
    assert shipped_checkpoint("cct", CIFAR10_CLASSES, directory=folder) is None
    (folder / "cct_cifar10.pt").write_bytes(b"")  # found by name: the load checks the content
    assert shipped_checkpoint("vit", CIFAR10_CLASSES, directory=folder) == folder / "cct_cifar10.pt"
    assert shipped_checkpoint("cct", CIFAR10_CLASSES, directory=folder) == folder / "cct_cifar10.pt"
    (folder / "vit_cifar10.pt").unlink()
    assert shipped_checkpoint("vit", CIFAR10_CLASSES, directory=folder) == folder / "cct_cifar10.pt"
    (folder / "cct_cifar10.pt").unlink()
    (folder / "cct_cifar10.pt").mkdir()  # not a file: passed over
    assert shipped_checkpoint("vit", CIFAR10_CLASSES, directory=folder) is None


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
    from hwnas.search import supernet_source

    monkeypatch.setattr(supernet_source, "shipped_checkpoint",
                        functools.partial(shipped_checkpoint, directory=tiny_vit_dir))
    data = SimpleNamespace(classes=list(CIFAR10_CLASSES))
    cfg = SimpleNamespace(space="vit", supernet=None)
    assert supernet_source.checkpoint_source(cfg, data, tmp_path) == tiny_vit_dir / "vit_cifar10.pt"
    given = SimpleNamespace(space="vit", supernet="mine.pt")
    assert supernet_source.checkpoint_source(given, data, tmp_path) == "mine.pt"
    digits = SimpleNamespace(classes=[str(i) for i in range(10)])
    assert supernet_source.checkpoint_source(cfg, digits, tmp_path) is None


# -- a search of vit on the shipped cct supernet (issue 44) --------------------------------------

@pytest.fixture(scope="module")
def cifar_like(tmp_path_factory):
    """An ImageFolder of random 32x32 images under CIFAR-10's ten class names: it finds the
    CIFAR-10 checkpoints."""
    from data_support import write_folder

    root = tmp_path_factory.mktemp("data") / "tencls"
    write_folder(root, {c: 6 for c in CIFAR10_CLASSES}, size=32)
    return root


@pytest.fixture(scope="module")
def package_dir(tiny_vit_dir, cifar_like, tmp_path_factory):
    """The checkpoints' folder with a tiny vit_cifar10.pt and a tiny cct_cifar10.pt (CCT's
    parts on, trained on nothing, recording ``cifar_like``'s training images)."""
    import dataclasses
    import shutil

    import torch
    from hwnas.supernet.data import load_dataset
    from hwnas.supernet.fingerprint import training_record
    from hwnas.supernet.spaces import CCT_CONFIG, CCTSpace
    from hwnas.supernet.train import default_config, save_checkpoint

    folder = tmp_path_factory.mktemp("package")
    shutil.copy(tiny_vit_dir / "vit_cifar10.pt", folder / "vit_cifar10.pt")
    space = CCTSpace(dataclasses.replace(
        CCT_CONFIG, tokenizer_channels=(8,), embed_choices=(16, 24), depth_choices=(1, 2),
        heads_choices=(1, 2), mlp_ratio_choices=(1.0, 2.0), head_dim=8))
    torch.manual_seed(0)
    data = load_dataset(str(cifar_like), seed=0)
    save_checkpoint(folder / "cct_cifar10.pt", space.build_supernet(), space, dataset="cifar10",
                    train_config=default_config(space, 2), half=True,
                    data_record=training_record(data))
    return folder


def _search(out, cifar_like, lines, **settings):
    from hwnas import search

    kwargs = dict(space="vit", dataset=str(cifar_like), devices=["edgetpu-est"],
                  objectives="accuracy,latency:edgetpu-est", trials=4, bits=False,
                  sensitivity_seeds=False, calib_batches=1, ptq_images=8, out=str(out))
    kwargs.update(settings)
    return search.run(progress=False, log=lines.append, **kwargs)


def test_vit_runs_on_the_shipped_cct_supernet(package_dir, cifar_like, tmp_path,
                                              monkeypatch) -> None:
    """``--space vit`` on CIFAR-10's classes takes cct_cifar10.pt, says so in one line, and the
    run records space cct: load_run and export read it, and ``--space vit`` again, or the run's
    own config, continues it."""
    import json

    from hwnas.export.model_export import ExportSettings
    from hwnas.export.run_export import export_run
    from hwnas.supernet import checkpoints

    import hwnas

    monkeypatch.setattr(checkpoints, "_HERE", package_dir)
    lines: list[str] = []
    result = _search(tmp_path, cifar_like, lines)
    run_dir = tmp_path / "tencls-vit"
    assert result.run_dir == run_dir
    said = [line for line in lines if "shipped cct supernet" in line]
    assert len(said) == 1 and said[0].startswith("--space vit on tencls: using the shipped cct")
    assert f"--supernet {package_dir / 'vit_cifar10.pt'}" in said[0]  # how to run on vit's own
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["space"], config["requested_space"], config["name"]) == ("cct", "vit",
                                                                             "tencls-vit")
    run = hwnas.load_run(run_dir)
    assert run.config.space == "cct" and run.space.name == "cct" and len(run.trials) == 4
    import optuna

    study = optuna.load_study(study_name="tencls-vit", storage=f"sqlite:///{run_dir / 'study.db'}")
    assert study.user_attrs["space"] == "cct"  # optuna-dashboard's view

    exported = export_run(run_dir, settings=ExportSettings(warmup=1, rounds=1, runs=2,
                                                           profile_runs=2),
                          progress=False, report=lambda line: None)
    assert exported.models and not exported.failed
    manifest = json.loads((exported.out_dir / "manifest.json").read_text())
    assert manifest["space"] == "cct"

    lines.clear()  # the same command again, a larger budget: the run goes on in cct
    _search(tmp_path, cifar_like, lines, trials=5)
    assert any(line.startswith(f"--space vit: continuing {run_dir} in space cct")
               for line in lines), lines
    assert len(hwnas.load_run(run_dir).trials) == 5
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["space"], config["requested_space"]) == ("cct", "vit")
    repeat = hwnas.load_run(run_dir).config  # the run's own settings find its directory
    repeat.trials = 6
    from hwnas import search

    assert search.run(repeat, progress=False, log=lines.append).run_dir == run_dir
    assert json.loads((run_dir / "config.json").read_text())["requested_space"] == "vit"


def test_a_given_cct_supernet_is_refused_for_vit(package_dir, cifar_like, tmp_path) -> None:
    """The family rule is the shipped checkpoint's only: --supernet of space cct with --space
    vit is refused as before."""
    from hwnas.core.errors import UserError

    with pytest.raises(UserError, match=r"holds space 'cct', not 'vit'"):
        _search(tmp_path, cifar_like, [], supernet=str(package_dir / "cct_cifar10.pt"))
    assert not (tmp_path / "tencls-vit").exists()
