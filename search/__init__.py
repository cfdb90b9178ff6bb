"""Multi-objective search over architectures and quantization policies.

:func:`run` is the API of ``hwnas search``::

    from hwnas import search
    result = search.run(space="mbv3-tiny", dataset="digits", trials=60,
                        objectives="accuracy,latency:cpu-ort-1t,size",
                        constraints=["latency:edgetpu-est<=2ms"])
    result.fronts["edgetpu-est"]      # the Pareto front on that device (a DataFrame)

Modules: :mod:`hwnas.search.config` (settings), :mod:`hwnas.search.objectives` (objective and constraint
parsing), :mod:`hwnas.search.bits` (the bit-width half of the search space), :mod:`hwnas.search.evaluator`
(metrics of a candidate), :mod:`hwnas.search.study` (Optuna storage, budget, recovery),
:mod:`hwnas.search.samplers`, :mod:`hwnas.search.outputs` and :mod:`hwnas.search.plots` (run directory files),
:mod:`hwnas.search.runner` (the whole job), :mod:`hwnas.cli` (the ``hwnas`` command line).
"""

from __future__ import annotations

from typing import Any

__all__ = ["run"]


def run(config: Any = None, *, overwrite: bool = False, progress: bool = True, log=print,
        **settings: Any):
    """Run (or continue) a search; ``config`` is a :class:`hwnas.search.config.SearchConfig`, or pass
    its fields as keyword arguments. Returns a :class:`hwnas.search.runner.SearchResult`.

    Examples:
        >>> from hwnas import search
        >>> result = search.run(supernet=checkpoint, trials=2, objectives="accuracy,latency:edgetpu-est",
        ...                     devices=["edgetpu-est"], sensitivity_seeds=False, out="runs",
        ...                     name="doc", progress=False, log=lambda *a: None)
        >>> len(result.trials), "edgetpu-est" in result.fronts      # checkpoint: a trained supernet
        (2, True)
    """
    from hwnas.search.config import SearchConfig
    from hwnas.search.runner import run_search

    if config is not None and settings:
        raise TypeError("pass either a SearchConfig or keyword settings, not both")
    cfg = config if config is not None else SearchConfig(**settings)
    return run_search(cfg, overwrite=overwrite, progress=progress, log=log)
