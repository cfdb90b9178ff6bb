"""The checks that turn bad input into one clear error before anything is written or trained:
seeds, devices, writable outputs, epochs, storages, crafted checkpoints, oversized latency
inputs, stale export directories. (The CLI-level cases are in tests/test_fuzz_*.py.)"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from hwnas.core.cli_args import MAX_SEED, bounded_int, seed_int
from hwnas.core.errors import UserError
from hwnas.core.io import check_writable, first_line, pid_alive


def test_seeds_are_32_bit_unsigned():
    assert seed_int("0") == 0 and seed_int(str(MAX_SEED)) == MAX_SEED
    for bad in ("-1", str(MAX_SEED + 1), "1.5", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            seed_int(bad)


def test_epochs_are_bounded_before_anything_runs():
    from hwnas.supernet.train import MAX_EPOCHS, sandwich_config

    parse = bounded_int(MAX_EPOCHS)
    assert parse(str(MAX_EPOCHS)) == MAX_EPOCHS
    with pytest.raises(argparse.ArgumentTypeError, match="up to"):
        parse("1" + "0" * 30)
    with pytest.raises(UserError, match="at most"):
        sandwich_config(MAX_EPOCHS + 1).validate()


def test_torch_devices_are_checked_against_this_machine():
    from hwnas.supernet.train import check_torch_device

    assert check_torch_device("cpu").type == "cpu"
    with pytest.raises(UserError, match="not a torch device"):
        check_torch_device("cpuu")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="CUDA is not available"):
            check_torch_device("cuda")


def test_writable_targets_are_probed_without_leaving_anything(tmp_path):
    check_writable(tmp_path / "a" / "b" / "c.pt")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserError, match="is a file"):
        check_writable(tmp_path / "f" / "x.pt")
    with pytest.raises(UserError, match="cannot write"):
        check_writable("/proc/x.pt")


def test_first_line_of_an_empty_message_is_the_type():
    assert first_line(EOFError()) == "EOFError"
    assert first_line(ValueError("\n  \nsecond\nthird")) == "second"


def test_dead_processes_are_told_apart():
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    assert pid_alive(os.getpid()) and not pid_alive(int(gone)) and not pid_alive(0)


def test_storages_are_checked_without_writing(tmp_path):
    from hwnas.search.study import check_storage, sqlite_path

    assert sqlite_path("sqlite:////abs/x.db").as_posix() == "/abs/x.db"
    assert sqlite_path("sqlite:///rel.db").as_posix() == "rel.db"
    assert sqlite_path("sqlite://") is None
    check_storage(f"sqlite:///{tmp_path}/s.db")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(UserError, match="does not exist"):
        check_storage(f"sqlite:///{tmp_path}/missing/s.db")
    (tmp_path / "d.db").mkdir()
    with pytest.raises(UserError, match="not a database file"):
        check_storage(f"sqlite:///{tmp_path}/d.db")


def test_a_checkpoint_with_an_unknown_augmentation_or_train_config_is_refused():
    from hwnas.supernet.data import load_dataset
    from hwnas.supernet.train import TrainConfig, with_training_augment

    data = load_dataset("digits", seed=0)
    with pytest.raises(UserError, match="does not know"):
        with_training_augment(data, {"augment": "warp"})
    with pytest.raises(UserError, match="not a training configuration"):
        with_training_augment(data, "abc")
    with pytest.raises(UserError, match="not a training configuration"):
        TrainConfig.from_dict({"bogus": 1})


def test_meta_adaptation_subsamples_many_measurements(monkeypatch):
    from hwnas.latency.predictors import load_pretrained
    from hwnas.latency.predictors import meta
    from hwnas.supernet.spaces import get_space

    monkeypatch.setattr(meta, "MAX_ADAPT_MEASUREMENTS", 50)
    space = get_space("nb201")
    rng = np.random.default_rng(0)
    archs = list({space.to_string(a): a for a in (space.sample(rng) for _ in range(400))}.values())
    pred = load_pretrained("nb201")
    seen = []
    fit = pred._fit_member

    def spy(K0, lam, y, *rest):
        seen.append(len(y))
        return fit(K0, lam, y, *rest)

    monkeypatch.setattr(pred, "_fit_member", spy)
    pred.adapt(archs, rng.uniform(1, 2, len(archs)), seed=0)
    assert seen and max(seen) == 50
    assert np.isfinite(pred.predict(archs[:5])).all()


def test_an_onnx_input_of_absurd_size_is_refused_before_it_is_allocated(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from hwnas.latency.onnx_measure import make_session, random_input

    shape = ["N", 1, 100000, 100000]
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(UserError, match="at most"):
        random_input(make_session(path))


def test_stale_export_staging_of_a_dead_process_is_removed(tmp_path):
    from hwnas.core.written import make_staging, remove_stale

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    live = make_staging(tmp_path / "export", "export")
    stale = live.with_name(live.name.replace(f"-{os.getpid()}-", f"-{gone}-"))
    live.rename(stale)
    live = make_staging(tmp_path / "export", "export")
    other = make_staging(tmp_path / "other", "export")
    other = other.rename(other.with_name(other.name.replace(f"-{os.getpid()}-", f"-{gone}-")))
    users = tmp_path / f".export.tmp-{gone}-0000"  # named like one, but no record: the user's
    for d in (stale, live, other, users):
        (d / "x").mkdir(parents=True)
    assert remove_stale(tmp_path / "export") == [stale]
    assert not stale.exists() and live.exists() and other.exists() and users.exists()
