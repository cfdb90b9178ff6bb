"""Variants of the screening sampler on the table of ``search_joint.py`` (development data).

A record of how the variants in ``search_joint.md`` ("Where the default misses") were measured:
the benchmark's own ``run_search`` with one thing of the default sampler changed (a
:class:`~hwnas.search.candidates.ScreeningConfig` field, or code by patching), nothing of it in
the package. Prints, per budget, the mean and worst seed of the hypervolume
ratio over the run's three objectives.

    OMP_NUM_THREADS=1 python benchmarks/search_joint_variants.py VARIANT [--first-seed 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

try:  # run as a script, benchmarks/ is on sys.path; loaded by a test, the repo root is
    import search_joint as sj
except ModuleNotFoundError:
    from benchmarks import search_joint as sj
from hwnas.search import screening  # noqa: E402

#: variant -> the ScreeningConfig fields it changes (the others patch code, in ``apply``)
CONFIG = {"default": {}, "ard": {"ard": True}, "ucb-beta-2": {"ucb_beta": 2.0},
          "cheap-trend": {"cheap_trend": True}, "flops": {}, "flops-size-trend": {"size_trend": True},
          "bits-mean": {}, "bits-mean-and-groups": {}, "uniform-startup": {},
          "uniform-startup-half": {}}


def apply(variant: str) -> None:
    """Patch the sampler (or the table's candidates) for a ``variant`` that changes code (those
    of ``CONFIG`` reach the sampler as ``run_search``'s screening options)."""
    if variant.startswith("flops"):  # the joint candidates count FLOPs: the cheap-front start-up
        sj.TableSpace.flops = lambda self, c: self.joint.space.flops(c.arch)
    if variant.startswith("bits-mean"):  # the policy as one column (and the groups' too)
        def encode(self, c):
            e, n = self.joint.encode(c), len(self.joint.groups)
            active = np.array(self.joint.active(c.arch), bool)
            cols = [e[:-n], [e[-n:][active].mean()]]
            if variant == "bits-mean-and-groups":
                cols.append(e[-n:])
            return np.concatenate(cols)
        sj.TableSpace.encode = encode
    if variant.startswith("uniform-startup"):  # random start-up among uniform policies
        choice = screening.ScreeningSampler._startup_choice

        def uniform_choice(self, rng, free):
            pool, joint = self._pool, self.space.joint
            uni = np.array([len({b for b, on in zip(pool.archs[i].bits,
                                                    joint.active(pool.archs[i].arch)) if on}) == 1
                            for i in free])
            if variant == "uniform-startup-half" and len(self._hist.keys) % 2:
                return choice(self, rng, free)
            return choice(self, rng, free[uni] if uni.any() else free)
        screening.ScreeningSampler._startup_choice = uniform_choice


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variant", choices=list(CONFIG))
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args()
    from hwnas.supernet.data.sources import load_dataset

    apply(args.variant)
    cfg = sj.run_config(None)
    joint = sj.joint_space(cfg, load_dataset(cfg.dataset, seed=cfg.data_seed))
    table = sj.load_table(sj.TABLE, [m.column for m in cfg.objective_metrics])
    problem = sj.make_problem(table, joint, cfg)
    front = sj.true_front(table, problem.columns, problem.directions)
    scores: dict[int, list[float]] = {50: [], 100: [], 300: []}
    t0 = time.time()
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        traj = sj.run_search(problem, "auto", seed, max(scores), CONFIG[args.variant])
        for b, v in scores.items():
            v.append(sj.hv_ratio(traj[:b], table, front, problem.directions))
    print(args.variant, f"seeds {args.first_seed}-{args.first_seed + args.seeds - 1}:", "  ".join(
        f"@{b} {np.mean(v):.3f} ({np.min(v):.3f})" for b, v in scores.items()),
        f"[{time.time() - t0:.0f} s]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
