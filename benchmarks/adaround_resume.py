"""AdaRound in parts: a long learned-rounding PTQ split over several commands.

A W4A8 AdaRound PTQ of the largest CIFAR-10 mbv3 subnet takes longer than the 10 minutes a
command may run on the shared benchmark machine. Within :func:`resumable`, each layer's learned
weight is kept in a folder as soon as :func:`hwnas.quant.adaround.adaround_layer` has learned
it and taken from there (its Adam steps skipped) when the same command runs again; once the
wall-clock budget is spent, :class:`Paused` is raised after a kept layer. The layers are learned
in module order, each on its input with the layers before it already rounded, from seeded
position draws, so a file finished in parts is the file of one uninterrupted run (CPU,
deterministic). The folder is one PTQ's: same subnet, calibration images, recipe and steps; a
kept layer whose nearest-rounding output error differs from the one recorded with it (another
PTQ's folder) is refused.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from hwnas.core.errors import UserError

__all__ = ["Paused", "folder_of", "resumable"]

SPENT_FILE = "spent_seconds"  # CPU and wall seconds of the parts before this one


def folder_of(root: Path | str, subnet: str, method: str, steps: int) -> Path:
    """The folder of one PTQ under ``root``: the same for ``adaround_steps.py`` and
    ``quant_peers.py``, so the test-image run can take the validation run's learned layers."""
    return Path(root) / subnet / f"{method.removesuffix('_adaround')}_{steps}"


class Paused(Exception):
    """The budget was spent; the learned layers are kept, run the same command again."""


class Part:
    """This part's place in the run: ``earlier_cpu`` and ``earlier_wall`` seconds spent by the
    parts before it, ``kept`` layers taken from the folder, ``learned`` layers learned now."""

    def __init__(self, earlier_cpu: float, earlier_wall: float) -> None:
        self.earlier_cpu, self.earlier_wall = earlier_cpu, earlier_wall
        self.kept = 0
        self.learned = 0


@contextlib.contextmanager
def resumable(folder: Path | str | None, budget_s: float) -> Iterator[Part]:
    """AdaRound keeping its learned layers in ``folder`` (None: plain AdaRound, nothing kept)
    and pausing after the first layer learned once ``budget_s`` wall seconds have passed since
    entry. On leaving (paused or not) the part's CPU and wall seconds are added to the folder's
    count, so the finished run can report the cost of all parts (``Part.earlier_cpu`` + its
    own), a part that only took kept layers included."""
    from hwnas.quant import adaround as module

    spent_file = Path(folder) / SPENT_FILE if folder else None
    earlier = ([float(v) for v in spent_file.read_text().split()]
               if spent_file and spent_file.is_file() else [0.0, 0.0])
    part = Part(*earlier)
    if folder is None:
        yield part
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    learn = module.adaround_layer
    start, cpu = time.perf_counter(), time.process_time()
    names = {}

    def kept_or_learned(layer, rows, target, config=None):
        path = Path(folder) / f"{names.setdefault(id(layer), len(names)):03d}.pt"
        if path.is_file():
            saved = torch.load(path, weights_only=True)
            with torch.no_grad():
                out = module._rows_forward(layer, rows, layer.weight_quant(layer.weight))
                nearest = float((out - target).pow(2).sum(1).mean())
            if not math.isclose(nearest, saved["report"]["mse_nearest"], rel_tol=1e-4):
                raise UserError(f"{path} was learned in another PTQ (nearest-rounding error "
                                f"{saved['report']['mse_nearest']:.6g} there, {nearest:.6g} "
                                f"here); use another folder")
            with torch.no_grad():
                layer.weight.copy_(saved["weight"])
            part.kept += 1
            return {k: float(v) for k, v in saved["report"].items()}
        report = learn(layer, rows, target, config)
        tmp = path.with_suffix(".tmp")
        torch.save({"weight": layer.weight.detach().clone(), "report": report}, tmp)
        tmp.replace(path)  # a killed part leaves no half-written layer
        part.learned += 1
        if time.perf_counter() - start > budget_s:
            raise Paused(f"{part.kept + part.learned} layers learned and kept in {folder}")
        return report

    module.adaround_layer = kept_or_learned
    try:
        yield part
    finally:
        module.adaround_layer = learn
        spent_file.write_text(f"{earlier[0] + time.process_time() - cpu:.3f} "
                              f"{earlier[1] + time.perf_counter() - start:.3f}")
