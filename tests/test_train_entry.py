"""``hwnas train`` into a run directory: chunks that resume, --eval, --standalone, --bench-steps,
a decoded dataset, data parallelism under torchrun (CPU smoke runs on digits)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hwnas.supernet.decoded import save_decoded
from hwnas.supernet.spaces import get_space
from hwnas.supernet.train import load_checkpoint, load_standalone
from hwnas.supernet.train_run import eval_archs

from hwnas.cli import main

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def decoded(tmp_path_factory, digits):
    return save_decoded(digits, tmp_path_factory.mktemp("data") / "digits-decoded.npz")


def _cli(*args: str) -> int:
    return main(["train", *args, "--quiet"])


def test_chunks_resume_and_eval(decoded, tmp_path, capsys, one_torch_thread):
    out = tmp_path / "run"
    base = ["--dataset", str(decoded), "--space", "mbv3-tiny", "--limit-train", "128",
            "--limit-eval", "100", "--batch-size", "64", "--out", str(out)]
    # a budget of ~nothing: one step, checkpointed, "not finished"
    assert _cli(*base, "--epochs", "2", "--max-minutes", "1e-6", "--eval") == 0
    text = capsys.readouterr().out
    assert "not finished" in text and "eval skipped" in text
    log = json.loads((out / "train_log.json").read_text())
    assert not log["completed"] and log["step"] == 1 and (out / "checkpoint.pt").is_file()
    # starting again without --resume is refused; --resume needs only --out
    assert _cli(*base, "--epochs", "2") == 2
    assert "already holds a run" in capsys.readouterr().err
    assert _cli("--out", str(out), "--resume", "--eval", "--calib-batches", "2") == 0
    text = capsys.readouterr().out
    assert "images/s" in text and "largest" in text
    log = json.loads((out / "train_log.json").read_text())
    assert log["completed"] and log["step"] == log["total_steps"] == 4 and len(log["chunks"]) == 2
    assert [h["epoch"] for h in log["history"]] == [1, 2]
    result = json.loads((out / "eval.json").read_text())
    assert [r["role"] for r in result["subnets"]] == ["largest", "smallest", "random1", "random2",
                                                      "random3"]
    assert all(0.0 <= r["top1"] <= 100.0 for r in result["subnets"])
    assert result["images"] == 100 and result["bn_recalibration"]["batches"] == 2
    # the final supernet.pt is the checkpoint format `hwnas search --supernet` reads
    space, _, payload = load_checkpoint(out / "supernet.pt")
    assert space.name == "mbv3-tiny" and "train_state" not in payload
    assert payload["train_config"] == json.loads((out / "run.json").read_text())["train_config"]
    assert payload["data_record"] and payload["extra"]["history"] == log["history"]
    # evaluating a finished run again trains nothing; it reads the final weights, so the
    # resumable checkpoint may be gone (a run directory downloaded without it)
    (out / "checkpoint.pt").unlink()
    (out / "eval.json").unlink()
    assert _cli("--out", str(out), "--resume", "--eval", "--calib-batches", "1",
                "--calib-batch-size", "16") == 0
    assert "already complete" in capsys.readouterr().out
    again = json.loads((out / "eval.json").read_text())
    assert again["bn_recalibration"] == {"batches": 1, "batch_size": 16, "augmented": True}
    # --overwrite starts afresh
    assert _cli(*base, "--epochs", "1", "--overwrite") == 0
    assert not (out / "eval.json").exists()
    assert json.loads((out / "train_log.json").read_text())["total_steps"] == 2


def test_training_seconds_survive_a_run_directory_rebuilt_from_its_checkpoint(
        decoded, tmp_path, capsys, one_torch_thread):
    """A run resumed on another machine from its checkpoint and run.json alone (the log's
    earlier chunks stayed behind) still records all its training seconds."""
    out = tmp_path / "run"
    assert _cli("--dataset", str(decoded), "--space", "mbv3-tiny", "--limit-train", "128",
                "--batch-size", "64", "--epochs", "2", "--max-minutes", "1e-6",
                "--out", str(out)) == 0
    prior = load_checkpoint(out / "checkpoint.pt")[2]["train_state"]["seconds"]
    assert prior > 0
    (out / "train_log.json").unlink()
    assert _cli("--out", str(out), "--resume") == 0
    capsys.readouterr()
    log = json.loads((out / "train_log.json").read_text())
    assert len(log["chunks"]) == 1 and log["completed"]
    expected = pytest.approx(prior + log["chunks"][0]["seconds"], rel=1e-9)
    assert log["train_seconds"] == expected
    assert load_checkpoint(out / "supernet.pt")[2]["extra"]["train_seconds"] == expected


def test_standalone_and_bench(decoded, tmp_path, capsys, one_torch_thread):
    out = tmp_path / "sa"
    assert _cli("--dataset", str(decoded), "--space", "mbv3-tiny", "--limit-train", "128",
                "--limit-eval", "100", "--batch-size", "64", "--epochs", "1", "--standalone",
                "random2", "--out", str(out), "--eval") == 0
    result = json.loads((out / "eval.json").read_text())
    space = get_space("mbv3-tiny")
    expected = eval_archs(space)[3][1]  # the same random2 as --eval reports
    assert result["subnets"][0]["arch"] == space.to_string(expected)
    assert not result["bn_recalibration"]
    _, arch, _, payload = load_standalone(out / "model.pt")
    assert arch == expected and payload["train_config"]["stages"][0]["name"] == "standalone"
    # a standalone checkpoint file, without a run directory
    assert _cli("--space", "mbv3-tiny", "--limit-train", "64", "--epochs", "1", "--standalone",
                "smallest", "--out", str(tmp_path / "small.pt")) == 0
    assert load_standalone(tmp_path / "small.pt")[1] == space.smallest()
    capsys.readouterr()
    assert _cli("--dataset", str(decoded), "--space", "mbv3-tiny", "--limit-train", "128",
                "--batch-size", "32", "--bench-steps", "3") == 0
    assert "images/s" in capsys.readouterr().out
    assert _cli("--dataset", str(decoded), "--space", "mbv3-tiny", "--standalone", "k3e2",
                "--out", str(tmp_path / "bad")) == 2
    err = capsys.readouterr().err
    assert "--standalone 'k3e2'" in err and "random1" in err
    assert not (tmp_path / "bad").exists()


def test_augment_override_is_kept_on_resume(decoded, tmp_path, monkeypatch, one_torch_thread):
    """--augment replaces the dataset's augmentation for training and BN recalibration, is
    recorded in run.json, and a resumed run keeps it."""
    import hwnas.supernet.data.loader as data_module

    seen = []
    real = data_module.augment_batch
    monkeypatch.setattr(data_module, "augment_batch",
                        lambda images, kind, generator, fill=None, **kw:
                        seen.append(kind) or real(images, kind, generator, fill, **kw))
    out = tmp_path / "cut"
    assert _cli("--dataset", str(decoded), "--space", "mbv3-tiny", "--limit-train", "128",
                "--limit-eval", "50", "--batch-size", "64", "--out", str(out), "--epochs", "2",
                "--augment", "crop_flip_cutout", "--max-minutes", "1e-6") == 0
    assert json.loads((out / "run.json").read_text())["settings"]["augment"] == "crop_flip_cutout"
    assert seen and set(seen) == {"crop_flip_cutout"}
    seen.clear()
    assert _cli("--out", str(out), "--resume", "--eval", "--calib-batches", "1") == 0
    assert seen and set(seen) == {"crop_flip_cutout"}  # training and recalibration alike


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("failure", ["interrupt", "disk-full"])
def test_overwrite_that_fails_keeps_the_previous_run(decoded, tmp_path, monkeypatch, capsys,
                                                     one_torch_thread, failure):
    """--overwrite builds the new run aside: training that is interrupted (Ctrl-C) or whose
    checkpoint write fails (a full disk) after it has started leaves the previous run byte for
    byte as it was, and no staging directory behind."""
    import errno

    import hwnas.supernet.train as train_module

    out = tmp_path / "run"
    base = ["--dataset", str(decoded), "--space", "mbv3-tiny", "--limit-train", "128",
            "--limit-eval", "50", "--batch-size", "64", "--out", str(out)]
    assert _cli(*base, "--epochs", "1") == 0
    before = _tree(out)
    assert "supernet.pt" in before and "checkpoint.pt" in before
    real_step, steps = train_module._Loop._step, []

    def failing_step(self, x, y, stage_i):
        steps.append(self.step)
        if len(steps) == 3:  # two steps in, a checkpoint of the new run already written aside
            assert any(tmp_path.glob(".run.tmp-*/checkpoint.pt"))
            if failure == "interrupt":
                raise KeyboardInterrupt
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_step(self, x, y, stage_i)

    monkeypatch.setattr(train_module._Loop, "_step", failing_step)
    status = _cli(*base, "--epochs", "3", "--overwrite", "--checkpoint-every-s", "1e-6")
    err = capsys.readouterr().err
    assert status == (130 if failure == "interrupt" else 2), err
    if failure == "disk-full":
        assert "No space left on device" in err and len(err.strip().splitlines()) == 1
    assert _tree(out) == before  # the old run, unchanged
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no staging left
    monkeypatch.setattr(train_module._Loop, "_step", real_step)
    assert _cli(*base, "--epochs", "2", "--overwrite") == 0  # and a complete one replaces it
    assert json.loads((out / "train_log.json").read_text())["total_steps"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_cudnn_autotuning_defaults_to_standalone_runs_only(tmp_path):
    """--cudnn-benchmark auto: on for a standalone network (one set of shapes), off for a
    supernet (every random subnet brings new shapes to tune), also when a run is resumed."""
    from hwnas.supernet.train_run import _is_standalone

    from hwnas.cli import parse_args

    def parse(*args: str):
        return parse_args(["train", *args])

    assert _is_standalone(parse("--standalone", "largest", "--out", str(tmp_path)))
    assert not _is_standalone(parse("--out", str(tmp_path)))
    (tmp_path / "run.json").write_text(json.dumps({"settings": {"standalone": "smallest"}}))
    assert _is_standalone(parse("--out", str(tmp_path), "--resume"))
    (tmp_path / "run.json").write_text(json.dumps({"settings": {"standalone": None}}))
    assert not _is_standalone(parse("--out", str(tmp_path), "--resume"))
    assert parse("--out", "x").cudnn_benchmark == "auto"
    # a supernet whose random subnets run masked has the largest's and smallest's shapes only
    from hwnas.supernet.train_run import _autotune
    assert not _autotune(parse("--out", "x"), "model", "default")
    assert not _autotune(parse("--out", "x"), "subnets", None)   # not compiled
    assert _autotune(parse("--out", "x"), "subnets", "reduce-overhead")  # also a resumed run's
    assert not _autotune(parse("--out", "x", "--cudnn-benchmark", "off"), "subnets", "default")
    assert _autotune(parse("--out", "x", "--cudnn-benchmark", "on"), "model", None)


def test_compile_scope_auto_masks_the_subnets_of_vit_family_supernets_on_cuda():
    """--compile-scope auto (the default): the random subnets run masked (``subnets``) for a
    supernet with forward_masked (vit, cct) on CUDA; ``model`` on the CPU, for a standalone
    network, and for supernets without masks; an explicit scope is kept."""
    import torch
    from hwnas.supernet.train_run import _compile_scope

    from hwnas.cli import parse_args

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    auto = parse_args(["train", "--out", "x", "--compile"])
    assert auto.compile_scope == "auto"
    cct = get_space("cct", num_classes=10).build_supernet()
    mbv3 = get_space("mbv3-tiny").build_supernet()
    assert _compile_scope(auto, cct, False, cuda) == "subnets"
    assert _compile_scope(auto, cct, False, cpu) == "model"
    assert _compile_scope(auto, cct, True, cuda) == "model"
    assert _compile_scope(auto, mbv3, False, cuda) == "model"
    step = parse_args(["train", "--out", "x", "--compile", "--compile-scope", "step"])
    assert _compile_scope(step, cct, False, cuda) == "step"


def test_needs_only_torch_and_numpy(decoded, tmp_path):
    """What the GPU machine may lack (pandas, sklearn, optuna, matplotlib, tqdm, Pillow, scipy)
    is not needed to train from a decoded file."""
    blocker = (  # a module set to None in sys.modules is one that is not installed
        "import sys\n"
        "for name in ('pandas', 'sklearn', 'optuna', 'matplotlib', 'tqdm', 'PIL', 'scipy'):\n"
        "    sys.modules[name] = None\n"
        "from hwnas.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", blocker, "train", "--dataset", str(decoded), "--space",
         "mbv3-tiny", "--limit-train", "128", "--limit-eval", "64", "--batch-size", "64",
         "--epochs", "1", "--out", str(tmp_path / "r"), "--eval", "--calib-batches", "1",
         "--quiet"],
        capture_output=True, text=True, timeout=300, cwd=REPO, check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "test top-1" in proc.stdout


def test_torchrun_two_processes_write_one_run(decoded, tmp_path):
    """``torchrun -m hwnas train``: two CPU processes (gloo) share each batch; only rank 0
    writes the run directory."""
    out = tmp_path / "ddp"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "hwnas", "train", "--dataset", str(decoded), "--space", "mbv3-tiny",
         "--limit-train", "64", "--batch-size", "64", "--epochs", "1", "--device", "cpu",
         "--out", str(out), "--quiet"],
        capture_output=True, text=True, timeout=300, cwd=REPO, check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("x 2 processes") == 1  # rank 0 speaks
    log = json.loads((out / "train_log.json").read_text())
    assert log["completed"] and len(log["chunks"]) == 1 and log["chunks"][0]["world_size"] == 2
    assert load_checkpoint(out / "supernet.pt")[0].name == "mbv3-tiny"
