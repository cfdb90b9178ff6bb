"""search_joint.py with the screening sampler's previous EHVI reference (``reference_sd = 0``):
the script takes no ``--screening-option``, so the config class that the sampler factory
imports is given that default (session 56's comparison in ``search_joint.md``)."""

import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # benchmarks/
from hwnas.search import screening  # noqa: E402

screening.ScreeningConfig = functools.partial(screening.ScreeningConfig, reference_sd=0.0)
import search_joint  # noqa: E402

sys.exit(search_joint.main(sys.argv[1:]))
