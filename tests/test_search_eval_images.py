"""``eval_images`` (``--eval-images``): a search scores its candidates on a stratified, seeded
subset of the validation split and its front models on one of the test split, so a CPU can
search a large dataset (CIFAR-10) in minutes; 0 keeps every image."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from hwnas.core.errors import UserError
from hwnas.search.config import SearchConfig
from hwnas.supernet.data import subsample_eval


def test_subsample_is_stratified_seeded_and_leaves_training(digits) -> None:
    cut = subsample_eval(digits, 100, seed=0)
    assert len(cut.val) == 100 and len(cut.test) == 100
    assert cut.train is digits.train
    # class shares follow the full split's, to within one image per class
    for full, part in ((digits.val, cut.val), (digits.test, cut.test)):
        want = np.bincount(full.labels.numpy(), minlength=10) * 100 / len(full)
        got = np.bincount(part.labels.numpy(), minlength=10)
        assert np.all(np.abs(got - want) <= 1)
    again = subsample_eval(digits, 100, seed=0)
    assert np.array_equal(again.val.labels.numpy(), cut.val.labels.numpy())
    assert bool((again.val.images == cut.val.images).all())
    other = subsample_eval(digits, 100, seed=1)
    assert not bool((other.val.images == cut.val.images).all())


def test_zero_or_a_larger_count_keeps_every_image(digits) -> None:
    assert subsample_eval(digits, 0, seed=0).val is digits.val
    big = subsample_eval(digits, len(digits.val) + len(digits.test), seed=0)
    assert big.val is digits.val and big.test is digits.test


@pytest.mark.parametrize("bad", [-1, 1.5, True, "100"])
def test_bad_counts_are_one_clear_error(digits, bad) -> None:
    with pytest.raises(UserError, match="eval_images"):
        subsample_eval(digits, bad, seed=0)
    with pytest.raises(UserError, match="eval.images"):
        SearchConfig(eval_images=bad).validate()


def test_the_flag_and_a_config_file_set_it(tmp_path) -> None:
    from hwnas.cli import build_parser, config_from_args

    args = build_parser().parse_args(["run", "--eval-images", "500"])
    assert config_from_args(args).eval_images == 500
    assert config_from_args(build_parser().parse_args(["search"])).eval_images == 0
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["run", "--eval-images", "-3"])
    assert exc.value.code == 2


def test_a_search_scores_on_the_subset_and_records_it(tmp_path, digits_checkpoint) -> None:
    from hwnas import search
    from hwnas.search.rundir import RunDir

    lines: list[str] = []
    result = search.run(supernet=str(digits_checkpoint), devices=["edgetpu-est"],
                        objectives="accuracy,latency:edgetpu-est", trials=2, out=str(tmp_path),
                        name="cut", sensitivity_seeds=False, eval_images=40, progress=False,
                        log=lines.append)
    assert any("40 validation and 40 test images" in line for line in lines), lines
    # 40 images: every accuracy is a multiple of 2.5 %
    for column in ("accuracy",):
        assert np.allclose(np.asarray(result.trials[column]) % 2.5, 0)
    front = pd.read_csv(RunDir(result.run_dir).pareto("edgetpu-est"))
    assert np.allclose(front["test_accuracy"] % 2.5, 0)
    import json
    assert json.loads(RunDir(result.run_dir).config.read_text())["eval_images"] == 40
    # continuing with another subset would mix scores of two validation sets: refused
    with pytest.raises(UserError, match="eval_images"):
        search.run(supernet=str(digits_checkpoint), devices=["edgetpu-est"],
                   objectives="accuracy,latency:edgetpu-est", trials=3, out=str(tmp_path),
                   name="cut", sensitivity_seeds=False, eval_images=0, progress=False,
                   log=lambda *a: None)


def test_a_run_written_before_the_setting_continues(tmp_path, digits_checkpoint) -> None:
    import json

    from hwnas import search
    from hwnas.search.rundir import RunDir

    settings = dict(supernet=str(digits_checkpoint), devices=["edgetpu-est"],
                    objectives="accuracy,latency:edgetpu-est", out=str(tmp_path), name="old",
                    sensitivity_seeds=False, progress=False, log=lambda *a: None)
    search.run(trials=1, **settings)
    config = RunDir(tmp_path / "old").config
    saved = json.loads(config.read_text())
    del saved["eval_images"]  # as an earlier hwnas wrote it
    config.write_text(json.dumps(saved))
    assert len(search.run(trials=2, **settings).trials) == 2
