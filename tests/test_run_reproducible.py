"""`hwnas run` that trains its supernet draws the initial weights from --seed, as `hwnas train`
does: the same seed gives the same run (found when two identical runs gave different files)."""

from __future__ import annotations

import torch

from hwnas.search import supernet_source
from hwnas.search.config import SearchConfig
from hwnas.supernet.data.sources import load_dataset


def _initial_weights(monkeypatch, tmp_path, seed: int, state: int) -> dict[str, torch.Tensor]:
    seen = {}

    def no_training(supernet, *args, **kwargs):
        seen.update({k: v.clone() for k, v in supernet.state_dict().items()})

    monkeypatch.setattr(supernet_source, "train_supernet", no_training)
    cfg = SearchConfig(space="mbv3-tiny", dataset="digits", epochs=1, seed=seed,
                       objectives="accuracy,size", devices=["edgetpu-est"])
    cfg.validate()
    torch.manual_seed(state)  # whatever state the process is in before the run
    supernet_source.resolve_supernet(cfg, load_dataset("digits", seed=0), tmp_path / "run",
                                     progress=False,
                                     continuing=False)
    return seen


def test_same_seed_same_initial_supernet(monkeypatch, tmp_path) -> None:
    a = _initial_weights(monkeypatch, tmp_path, 0, state=1)
    b = _initial_weights(monkeypatch, tmp_path, 0, state=2)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    c = _initial_weights(monkeypatch, tmp_path, 1, state=1)
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].is_floating_point())
