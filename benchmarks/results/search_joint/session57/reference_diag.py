"""Where the screening sampler's 2-D EHVI reference sits in search_joint.py's two-objective view
(session 57, ``search_joint.md``): each acquisition's reference cost (its
``reference_candidate``, recorded by wrapping it), the cost of the most accurate predicted
candidate, and the share of candidates whose mean plus two deviations reaches that one's mean.
Arguments after the script's own are search_joint.py's (e.g. ``--screening-option
reference_sd=0``)::

    OMP_NUM_THREADS=1 python benchmarks/results/search_joint/session57/reference_diag.py --screening-option reference_sd=2
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # benchmarks/
import hwnas.search.layered as layered  # noqa: E402
import hwnas.search.screening as screening  # noqa: E402

LOG: list[tuple[float, float, float, float]] = []


def recorded(mu, sd, cost, ok, plausible_sd=0.0):
    i = layered.reference_candidate(mu, sd, cost, ok, plausible_sd)
    best = int(np.argmax(mu))
    LOG.append((cost[i], cost[best], float(np.mean(mu + 2 * sd >= mu[best])), cost.max()))
    return i


screening.reference_candidate = recorded
import search_joint  # noqa: E402

search_joint.main(["--samplers", "auto", "--objectives", "accuracy,latency:fpga-zcu102-est",
                   "--quiet", "--seeds", "5", "--budgets", "300", *sys.argv[1:]])
a = np.array(LOG)
print(f"acquisitions {len(a)}; reference at the slowest candidate {np.mean(a[:, 0] >= a[:, 3]):.3f}; "
      f"most accurate predicted at the slowest {np.mean(a[:, 1] >= a[:, 3]):.3f}; "
      f"reference cost median {np.median(a[:, 0]):.4f} ms; share of candidates within 2 sd of "
      f"the best mean: median {np.median(a[:, 2]):.4f}, 90th percentile {np.quantile(a[:, 2], .9):.4f}")
