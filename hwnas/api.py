"""A finished run, from Python: ``hwnas.load_run(path)`` and :class:`hwnas.Run`.

The way back into a run directory for notebooks and scripts, without repeating the search::

    run = hwnas.load_run("runs/digits-mbv3-tiny")
    run.trials                       # every completed trial (DataFrame)
    run.fronts["edgetpu-est"]        # the Pareto front on one device (DataFrame)
    best = run.select("edgetpu-est", max_latency_ms=2.0)
    model = run.model(best.trial)    # the subnet as the search scored it (nn.Module)
    run.latency(best.trial, "jetson-orin-nano-est")
    run.export(select=[best.trial])  # ONNX files, verified and timed
    run.finetune(best.trial, epochs=3)  # distilled from the largest subnet (QAT with a policy)

It replays the run as the search saw it (:class:`hwnas.search.replay.RunReplay`) and sits on
the top floor, beside the command line: it reaches every layer below.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path
from typing import Any

from hwnas.search.replay import RunReplay

from hwnas.core.errors import UserError

__all__ = ["Run", "load_run"]


def load_run(path: str | Path) -> Run:
    """The run in ``path`` (a directory written by ``hwnas search`` / ``hwnas run`` /
    :func:`hwnas.search.run`); UserError (one line) when it is not one.

    Examples:
        >>> import hwnas
        >>> run = hwnas.load_run(run_dir)     # run_dir: a finished `hwnas search` / `hwnas run`
        >>> run.config.space, len(run.trials) > 0
        ('mbv3-tiny', True)
        >>> front = run.fronts["edgetpu-est"]  # the Pareto front on a device, a DataFrame
        >>> int(front.trial.iloc[0]) in set(run.trials.trial)
        True
    """
    return Run(path)


class Run(RunReplay):
    """A run directory, read lazily: tables on first use, the supernet and dataset on the
    first model or latency asked for (:class:`hwnas.search.replay.RunReplay`: ``config``,
    ``trials``, ``fronts``, ``space``, ``supernet``, ``data``, ``evaluator``).

    Examples:
        >>> from hwnas import Run
        >>> run = Run(run_dir)                # what hwnas.load_run(run_dir) returns
        >>> fastest = run.fronts["edgetpu-est"].iloc[0]
        >>> model = run.model(int(fastest.trial), quantized=False)   # its float subnet, an nn.Module
        >>> run.latency(int(fastest.trial), "edgetpu-est") > 0      # ms, on any device
        True
    """

    def __repr__(self) -> str:
        return f"Run({str(self.dir.path)!r}: {self.config.space} on {self.dataset_name})"

    @cached_property
    def settings(self) -> dict[str, Any]:
        """config.json as written by the search (a dict, with what the run resolved:
        ``dataset_name``, ``reported_devices``...); :attr:`config` is the typed view."""
        return self.dir.read_config()

    @property
    def dataset_name(self) -> str:
        """The dataset's name as the run resolved it (``digits``, ``cifar10``...)."""
        return self.settings.get("dataset_name") or self.config.dataset

    def select(self, device: str, max_latency_ms: float):  # -> pd.Series
        """The most accurate model of ``device``'s front within ``max_latency_ms`` there
        (:func:`hwnas.search.outputs.select_under_budget`)."""
        from hwnas.search.outputs import select_under_budget

        if device not in self.fronts:
            raise UserError(f"{self.path} has no front for device {device!r}; fronts: "
                            f"{', '.join(self.fronts) or 'none'}")
        return select_under_budget(self.fronts[device], device, max_latency_ms)

    def device_ranks(self, *, all_trials: bool = False):  # -> pd.DataFrame
        """How the models rank on every device (:func:`hwnas.search.outputs.device_ranks`): the
        union of the fronts, or every trial with ``all_trials``."""
        from hwnas.search.outputs import device_ranks

        return device_ranks(self.fronts, trials=self.trials if all_trials else None)

    def model(self, trial: int, *, quantized: bool | None = None):  # -> nn.Module
        """Trial ``trial``'s model as the search scored it: a standalone ``nn.Module`` (the
        subnet extracted from the supernet, BatchNorm recalibrated), in eval mode.
        ``quantized``: None (default) = as searched (PTQ fake-quant under its policy, if it has
        one); False = the float subnet; True = quantized (UserError for a float trial)."""
        arch, policy = self.candidate(trial)
        if quantized and policy is None:
            raise UserError(f"trial {trial} is a float model (no bit policy); pass "
                            f"quantized=False or None")
        evaluator = self.evaluator
        model = evaluator.float_model(arch)
        if policy is not None and quantized is not False:
            model = evaluator.quantized_model(model, policy)
        return model.eval()

    def accuracy(self, trial: int, *, split: str = "test", quantized: bool | None = None) -> float:
        """Top-1 accuracy (%) of :meth:`model` on ``split`` (train, val or test)."""
        from hwnas.supernet.evaluate import accuracy, eval_loader

        if split not in ("train", "val", "test"):
            raise UserError(f"split must be train, val or test, got {split!r}")
        model = self.model(trial, quantized=quantized)
        device = next(model.parameters()).device
        return accuracy(model, eval_loader(self.data, getattr(self.data, split), device=device))

    def latency(self, trial: int, device: str) -> float:
        """Latency (ms) of trial ``trial`` (under its policy) on ``device``, any device of
        ``hwnas latency devices`` that covers the space, computed as the search computes it
        (measured devices time the model here)."""
        from hwnas.latency.devices import get_device
        from hwnas.search.evaluator import device_latency

        arch, policy = self.candidate(trial)
        space = self.space
        mean, _ = device_latency(get_device(device, space), space, arch, policy)
        if not math.isfinite(mean):
            raise UserError(f"device {device!r} gave no latency for trial {trial}")
        return float(mean)

    # -- files -------------------------------------------------------------------------------
    def export(self, select: str | Iterable[int] = "all", *, front: str | None = None,
               out: str | Path | None = None, settings: Any = None, progress: bool = False,
               **options: Any):  # -> RunExport
        """Export models of the fronts to ONNX (:func:`hwnas.export.run_export.export_run`):
        ``select`` is ``"all"``, ``"top:K"``, ``"fastest:K"`` or trial numbers; ``settings`` an
        :class:`hwnas.export.model_export.ExportSettings` (e.g. ``uint8_input=True``)."""
        from hwnas.export.run_export import export_run

        if not isinstance(select, str):
            select = ",".join(str(int(t)) for t in select)
        return export_run(self.path, front=front, select=select, out=out, settings=settings,
                          progress=progress, **options)

    def finetune(self, trial: int, *, epochs: int = 3, lr: float | None = None,
                 batch_size: int = 128, device: str = "cpu", out: str | Path | None = None,
                 overwrite: bool = False, progress: bool = True, settings: Any = None,
                 export_settings: Any = None,
                 devices: Iterable[str] | None = None):  # -> FinetuneResult
        """Fine-tune trial ``trial`` by distillation from the supernet's largest subnet (LSQ
        QAT under its policy, if it has one), save it to ``out`` (default
        ``finetune/trial_NNNN``) and export it again
        (:func:`hwnas.export.finetune.finetune_trial`). ``settings``: a
        :class:`hwnas.export.finetune.FinetuneSettings` (replaces ``epochs``, ``lr`` (None:
        the space's), ``batch_size`` and ``device``); ``devices``: where to time the exported
        files (default the run's measured devices, ``()`` none)."""
        from hwnas.export.finetune import FinetuneSettings, finetune_trial

        settings = settings or FinetuneSettings(epochs=epochs, lr=lr, batch_size=batch_size,
                                                device=device)
        return finetune_trial(self, trial, settings=settings, out=out, overwrite=overwrite,
                              export_settings=export_settings, progress=progress,
                              devices=None if devices is None else list(devices))
