"""Optuna samplers by name, always seeded.

The default for categorical architecture spaces and budgets under ~1000 trials is multivariate
TPE; NSGA-II needs larger budgets to pay off, random is the baseline every method must beat.
"""

from __future__ import annotations

import optuna

from supernet.errors import UserError

SAMPLERS = ("tpe", "nsga2", "random", "gp")
DEFAULT_SAMPLER = "tpe"


def make_sampler(name: str, seed: int, *, n_startup_trials: int = 10) -> optuna.samplers.BaseSampler:
    """A seeded sampler; every option is set explicitly so a change of Optuna's defaults does
    not silently change a study."""
    if name == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, n_startup_trials=n_startup_trials, constant_liar=True
        )
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=20)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=n_startup_trials)
    raise UserError(f"unknown sampler {name!r}; expected one of {list(SAMPLERS)}")
