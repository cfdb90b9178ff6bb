"""Optuna samplers by name, always seeded.

The default for categorical architecture spaces and budgets under ~1000 trials is multivariate
TPE; NSGA-II needs larger budgets to pay off, random is the baseline every method must beat.
Every option is set explicitly, so a change of Optuna's defaults does not silently change a
study (Optuna 5: constraints come from ``trial.set_constraint``, which TPE, NSGA-II and GP read
without a ``constraints_func``).

Seed trials (enqueued: largest, smallest, sensitivity-based bit policies) are evaluated before
the sampler is asked for anything, and TPE and GP count *every* completed trial towards their
random start-up phase; ``n_seeds`` extends that phase so the seeds do not eat into it.
"""

from __future__ import annotations

import optuna

from supernet.errors import UserError

SAMPLERS = ("tpe", "nsga2", "random", "gp")
DEFAULT_SAMPLER = "tpe"
STARTUP_TRIALS = 10


def make_sampler(name: str, seed: int, *, n_startup_trials: int = STARTUP_TRIALS,
                 n_seeds: int = 0) -> optuna.samplers.BaseSampler:
    """A seeded sampler (see the module docstring for ``n_seeds``)."""
    startup = n_startup_trials + n_seeds
    if name == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, n_startup_trials=startup, constant_liar=True,
            n_ei_candidates=24,
        )
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=20)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup)
    raise UserError(f"unknown sampler {name!r}; expected one of {list(SAMPLERS)}")
