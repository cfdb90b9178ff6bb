"""One replay of a run: its supernet, data and scoring as the search saw them.

The search (and its extra workers), ``hwnas export``, ``hwnas finetune`` and
:func:`hwnas.load_run` all rebuild a run's models, so they must rebuild the same splits (the
dataset loaded with ``data_seed``, validation and test disjoint from the images the supernet
trained on), the same augmentation (the one the supernet trained with, for BatchNorm
recalibration) and the same scoring settings. :func:`replay_splits`, :func:`load_run_supernet`,
:func:`eval_settings` and :class:`RunReplay` are that rebuild, written once. Torch is imported
on first use: reading a run's tables stays light.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hwnas.search.rundir import RunDir

from hwnas.core.errors import UserError

if TYPE_CHECKING:
    from hwnas.search.config import SearchConfig
    from hwnas.search.evaluator import EvalSettings, TrialEvaluator
    from hwnas.supernet.data.splits import DatasetSplits

__all__ = ["RunReplay", "eval_settings", "load_run_supernet", "replay_splits"]


def _quiet(_: str) -> None:
    return None


def replay_splits(cfg: SearchConfig, checkpoint: Mapping[str, Any], source: str, *,
                  data: DatasetSplits | None = None, disjoint: bool = True,
                  scoring: bool = False, log: Callable[[str], Any] = _quiet) -> DatasetSplits:
    """The run's splits as its search saw them: ``cfg.dataset`` loaded with ``cfg.data_seed``
    (or ``data``, already loaded so), validation and test disjoint from the images the
    supernet trained on (``checkpoint["data_record"]``; the checkpoint read from ``source``),
    and the augmentation it trained with (``checkpoint["train_config"]``).

    ``disjoint=False``: the supernet was just trained on ``data.train`` by this process (the
    search does not check its own training images). ``scoring``: validation and test cut to
    ``cfg.eval_images``, the search's scoring budget; export, fine-tuning and
    :func:`hwnas.load_run` use the whole splits."""
    from hwnas.supernet.data.sources import load_dataset
    from hwnas.supernet.data.splits import subsample_eval
    from hwnas.supernet.fingerprint import disjoint_validation
    from hwnas.supernet.train import with_training_augment

    if data is None:
        data = load_dataset(cfg.dataset, seed=cfg.data_seed)
    if disjoint:
        data = disjoint_validation(data, dict(checkpoint), source, seed=cfg.data_seed, log=log)
    data = with_training_augment(data, checkpoint.get("train_config"))
    if scoring:
        data = subsample_eval(data, cfg.eval_images, seed=cfg.data_seed)
    return data


def load_run_supernet(run_dir: RunDir, cfg: SearchConfig, *, device: Any = "cpu"):
    """(space, supernet, checkpoint payload) of the run's supernet.pt, on ``device``;
    UserError when it holds another space than config.json names."""
    from hwnas.supernet.train import load_checkpoint

    space, supernet, payload = load_checkpoint(run_dir.supernet, device=device)
    if space.name != cfg.space:
        raise UserError(f"{run_dir.supernet} holds space {space.name!r} but {RunDir.CONFIG} "
                        f"says {cfg.space!r}; the run directory is inconsistent")
    return space, supernet, payload


def eval_settings(cfg: SearchConfig) -> EvalSettings:
    """How the run scores a candidate (BatchNorm recalibration and PTQ): its
    :class:`hwnas.search.evaluator.EvalSettings`."""
    from hwnas.search.evaluator import EvalSettings

    return EvalSettings(calib_batches=cfg.calib_batches, ptq_images=cfg.ptq_images, seed=cfg.seed)


class RunReplay:
    """A finished run read back to rebuild its trials: the typed settings at once
    (:meth:`RunDir.read_search_config`); the tables, supernet, splits and evaluator on first use.
    What fine-tuning works on, and the base of the notebook facade :class:`hwnas.Run`."""

    def __init__(self, path: str | Path) -> None:
        self.dir = RunDir(path)
        #: config.json as the :class:`hwnas.search.config.SearchConfig` the search ran with
        #: (pass it to :func:`hwnas.search.run` to continue or repeat the search)
        self.config: SearchConfig = self.dir.read_search_config()

    @property
    def path(self) -> Path:
        return self.dir.path

    @cached_property
    def trials(self):  # -> pd.DataFrame
        """Every completed trial (trials.parquet): arch, policy, metrics, feasible, pareto."""
        return self.dir.read_trials()

    @cached_property
    def fronts(self) -> dict:  # -> dict[str, pd.DataFrame]
        """``{device: its Pareto front}`` (pareto_<device>.csv), fastest first."""
        return self.dir.read_fronts()

    def row(self, trial: int):  # -> pd.Series
        """The trials.csv row of trial number ``trial``."""
        try:
            number = operator.index(trial)
        except TypeError:
            raise UserError(f"trial must be a trial number, got {trial!r}") from None
        if isinstance(trial, bool):
            raise UserError(f"trial must be a trial number, got {trial!r}")
        rows = self.trials[self.trials["trial"] == number]
        if rows.empty:
            known = ", ".join(str(t) for t in sorted(self.trials["trial"])[:12])
            raise UserError(f"no completed trial {trial} in {self.path}; trials: {known}")
        return rows.iloc[0]

    def candidate(self, trial: int) -> tuple[Any, Any]:
        """(architecture, QuantPolicy or None) of ``trial``."""
        from hwnas.search.evaluator import policy_from_text

        row = self.row(trial)
        arch = row["arch"]
        if not isinstance(arch, str) or not arch.strip():
            raise UserError(f"trial {trial} of {self.path} has no model: its architecture is "
                            f"missing from the trials table")
        return self.space.from_string(arch), policy_from_text(row["policy"])

    @cached_property
    def _checkpoint(self) -> tuple[Any, Any, dict]:
        """(space, supernet, payload) of the run's supernet.pt."""
        return load_run_supernet(self.dir, self.config)

    @property
    def space(self):  # -> SearchSpace
        """The run's search space, as its supernet was built (input size, classes)."""
        return self._checkpoint[0]

    @property
    def supernet(self):  # -> nn.Module
        """The run's weight-sharing supernet, as loaded from its supernet.pt."""
        return self._checkpoint[1]

    @cached_property
    def data(self):  # -> DatasetSplits
        """The run's dataset, split as the search split it (validation disjoint from the
        supernet's training images), with the checkpoint's training augmentation."""
        return replay_splits(self.config, self._checkpoint[2], str(self.dir.supernet))

    @cached_property
    def evaluator(self) -> TrialEvaluator:
        """The evaluator the search scored trials with (BatchNorm recalibration and PTQ on the
        run's splits and settings): what models and fine-tuning rebuild trials with."""
        from hwnas.search.evaluator import TrialEvaluator

        return TrialEvaluator(self.space, self.supernet, self.data, [], eval_settings(self.config))
