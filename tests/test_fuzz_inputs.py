"""Fuzz suite, input files: crafted and broken checkpoints, datasets and study storages end in
one error line, exit status 2, no traceback, nothing written (tests/fuzz_support.py). Nothing
in a file executes: a pickle that would run code is refused by the loader."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
from fuzz_support import assert_clean_refusal

SEARCH = ["search", "--devices", "edgetpu-est", "--no-bits", "--objectives", "accuracy,size",
          "--trials", "2", "--quiet", "--out", "runs"]


class _Boom:
    def __reduce__(self):
        return (exec, ("open('PWNED', 'w').write('x')",))


def _nan(p):
    name = next(k for k, v in p["state_dict"].items() if v.is_floating_point())
    p["state_dict"][name] = torch.full_like(p["state_dict"][name], float("nan"))


CHECKPOINTS = {
    "empty": (None, "cannot read supernet checkpoint"),
    "garbage": (b"\x00\x01not a checkpoint", "cannot read supernet checkpoint"),
    "pickle-exec": ("exec", "cannot read supernet checkpoint"),
    "no-format": (lambda p: p.pop("format"), "not an hwnas supernet checkpoint"),
    "negative-classes": (lambda p: p["space_config"].update(num_classes=-3), "builds no network"),
    "unknown-space": (lambda p: p.update(space="nope"), "unknown space"),
    "state-dict-list": (lambda p: p.update(state_dict=list(p["state_dict"].values())),
                        "holds no weights"),
    "state-dict-missing": (lambda p: p.pop("state_dict"), "holds no weights"),
    "train-config-string": (lambda p: p.update(train_config="abc"), "not a training configuration"),
    "train-config-unknown-key": (lambda p: p["train_config"].update(bogus=1),
                                 "not a training configuration"),
    "unknown-augment": (lambda p: p["train_config"].update(augment="warp"), "augment must be one of"),
    "nan-weights": (_nan, "non-finite weights"),
}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("case", list(CHECKPOINTS))
def test_bad_checkpoints(case, workdir, fuzz_checkpoint, capsys):
    change, message = CHECKPOINTS[case]
    path = workdir / "bad.pt"
    if change is None:
        path.write_bytes(b"")
    elif isinstance(change, bytes):
        path.write_bytes(change)
    elif change == "exec":
        path.write_bytes(pickle.dumps(_Boom()))
    else:
        payload = copy.deepcopy(torch.load(fuzz_checkpoint, weights_only=True))
        change(payload)
        torch.save(payload, path)
    assert_clean_refusal([*SEARCH, "--supernet", str(path)], message, capsys, workdir)
    assert not (workdir / "PWNED").exists()


def _npz_without_keys(d):
    np.savez(d / "data.npz", images=np.zeros((2, 8, 8), np.uint8))
    return d / "data.npz"


def _text_as_npz(d):
    (d / "data.npz").write_text("hello")
    return d / "data.npz"


def _empty_dir(d):
    (d / "images").mkdir()
    return d / "images"


DATASETS = {
    "missing": (lambda d: d / "nope", "does not exist"),
    "empty-dir": (_empty_dir, "no class sub-folders"),
    "text-npz": (_text_as_npz, "as a cifar10-jpeg .npz"),
    "npz-without-keys": (_npz_without_keys, "missing key(s)"),
    "empty-name": (lambda d: "", "non-empty"),
}


@pytest.mark.parametrize("case", list(DATASETS))
def test_bad_datasets(case, workdir, fuzz_checkpoint, capsys):
    make, message = DATASETS[case]
    spec = str(make(workdir))
    assert_clean_refusal([*SEARCH, "--supernet", str(fuzz_checkpoint), "--dataset", spec],
                         message, capsys, workdir)


STORAGES = {
    "not-a-url": (["--storage", "study.db"], "not a database URL"),
    "sqlite-missing-dir": (["--storage", "sqlite:///missing/dir/s.db"], "does not exist"),
    "sqlite-a-directory": (["--storage", "sqlite:///a_dir"], "not a database file"),
    "sqlite-two-workers": (["--storage", "sqlite:///s.db", "--workers", "2"],
                           "SQLite cannot be shared"),
    "dead-postgresql": (["--storage", "postgresql://u@127.0.0.1:1/db"], "storage"),
    "unknown-dialect": (["--storage", "nosuchdb://x/y"], "storage"),
}


@pytest.mark.parametrize("case", list(STORAGES))
def test_bad_storages(case, workdir, fuzz_checkpoint, capsys):
    (workdir / "a_dir").mkdir()
    extra, message = STORAGES[case]
    assert_clean_refusal([*SEARCH, "--supernet", str(fuzz_checkpoint), *extra], message,
                         capsys, workdir)
