"""The screening sampler in real searches: ``hwnas search --sampler screening`` (architecture
and bit-widths), its candidates, cheap constraints, determinism and resume.

The sampler-level tests run the search's own objective (:func:`hwnas.search.runner.make_objective`)
with the real cheap metrics and a synthetic accuracy instead of the supernet, so they take
seconds; the end-to-end test runs the CLI on the digits default with a 1-epoch supernet.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
from hwnas.latency.devices import get_device
from hwnas.search.bits import ArchBits, ArchBitsSpace, bit_groups
from hwnas.search.config import SearchConfig
from hwnas.search.evaluator import (
    COST_METRICS,
    CheapMetrics,
    device_latency,
    quantized_layers,
)
from hwnas.search.objectives import Metric, parse_constraint
from hwnas.search.runner import build_sampler, make_objective
from hwnas.search.samplers import make_sampler, screening_problem
from hwnas.search.screening import ScreeningConfig, ScreeningSampler
from hwnas.supernet.spaces import get_space

from hwnas.cli import main
from hwnas.core.errors import UserError

DEVICE = "edgetpu-est"


@pytest.fixture(scope="module")
def checkpoint(digits_checkpoint, one_torch_thread) -> Path:
    """The session's one-epoch digits supernet (``hwnas train --epochs 1``, tests/conftest.py):
    the searches here only read it."""
    return digits_checkpoint


# -- a fast search: real objective and cheap metrics, synthetic accuracy ----------------------


class SyntheticEvaluator:
    """Stands in for :class:`hwnas.search.evaluator.TrialEvaluator`: the real cost metrics and
    latencies (the functions the trial evaluator uses), and an accuracy that grows with the
    FLOPs and loses with low weight widths — no supernet, so a trial takes milliseconds."""

    def __init__(self, space, devices: list[str]) -> None:
        self.space = space
        self.devices = {d: get_device(d, space) for d in devices}

    def __call__(self, arch, policy) -> dict[str, float]:
        layers, q_layers = quantized_layers(self.space, arch, policy)
        metrics = {col: f(layers, q_layers, policy) for col, f in COST_METRICS.items()}
        bits_loss = 0.0 if policy is None else 5 * float(np.mean(
            [2.0 ** (6 - w) if w < 32 else 0.0 for w, _ in policy.bits.values()]))
        metrics["accuracy"] = 50 + 6 * math.log(metrics["flops"]) / math.log(10) - bits_loss
        for name, device in self.devices.items():
            mean, _ = device_latency(device, self.space, arch, policy)
            metrics[f"latency_ms:{name}"] = mean
            metrics[f"latency_std_ms:{name}"] = float("nan")
        return metrics


def synthetic_search(cfg: SearchConfig, n_trials: int, *, pool_size: int = 200,
                     seeds: list[dict] | None = None) -> tuple[optuna.Study, ArchBitsSpace | None]:
    """An in-memory study of the search ``cfg`` describes with the screening sampler (a small
    pool, 5 start-up trials), its objective and constraints as in a real search."""
    space = get_space(cfg.space)
    evaluator = SyntheticEvaluator(space, cfg.all_devices)
    problem = screening_problem(space, cfg.objective_metrics, cfg.constraint_list,
                                evaluator.devices, bits=cfg.bits, bit_choices=cfg.bit_choices)
    sampler = ScreeningSampler(
        problem.space, problem.cheap, problem.cheap_indices, seed=cfg.seed,
        directions=problem.directions, config=ScreeningConfig(n_startup_trials=5,
                                                              pool_size=pool_size),
        constraints=problem.constraints, constraint_names=problem.constraint_names,
        cheap_predicted=problem.cheap_predicted)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=[m.direction for m in cfg.objective_metrics],
                                sampler=sampler)
    for params in seeds or []:
        study.enqueue_trial(params, user_attrs={"seed": "test"})
    study.optimize(make_objective(space, evaluator, cfg), n_trials=n_trials)
    return study, (problem.space if cfg.bits else None)


def _cfg(**kw) -> SearchConfig:
    base = dict(objectives=f"accuracy,latency:{DEVICE}", devices=[DEVICE], seed=0)
    cfg = SearchConfig(**{**base, **kw})
    cfg.validate()
    return cfg


def test_proposals_are_valid_architectures_and_bit_policies():
    cfg = _cfg()
    study, joint = synthetic_search(cfg, 14)
    space, groups = joint.space, bit_groups(joint.space)
    keys = set()
    for t in study.trials:
        assert t.state == optuna.trial.TrialState.COMPLETE
        assert set(t.params) == set(joint.to_params(joint.sample(np.random.default_rng(0))))
        assert all(t.params[f"bits:{g}"] in cfg.bit_choices for g in groups)
        cand = joint.suggest(optuna.trial.FixedTrial(t.params))
        assert isinstance(cand, ArchBits)
        # the whole candidate came from the sampler (no parameter fell back to a random draw):
        # its parameters are exactly those of a member of the space
        assert joint.to_params(cand) == t.params
        assert space.from_string(space.to_string(cand.arch)) == cand.arch
        assert t.user_attrs["arch"] == space.to_string(cand.arch)
        keys.add(joint.to_string(cand))
    assert len(keys) == len(study.trials)  # never pays twice for one model
    # both halves are searched: several architectures and several bit policies
    assert len({t.user_attrs["arch"] for t in study.trials}) > 5
    assert len({t.user_attrs["policy"] for t in study.trials}) > 5


def test_cheap_constraint_screens_the_candidates():
    cfg = _cfg(objectives="accuracy,size")
    space = get_space(cfg.space)
    joint = ArchBitsSpace(space, cfg.bit_choices)
    device = get_device(DEVICE, space)
    rng = np.random.default_rng(1)
    sample = [joint.sample(rng) for _ in range(200)]
    lat = np.array([device_latency(device, space, c.arch, joint.policy(c))[0] for c in sample])
    bound = float(np.quantile(lat, 0.3))  # about 30 % of random candidates meet it
    text = f"latency:{DEVICE}<={bound * 1e3:.3f}us"
    cfg = _cfg(objectives="accuracy,size", constraints=[text])
    study, joint = synthetic_search(cfg, 20)
    for t in study.trials:
        cand = joint.suggest(optuna.trial.FixedTrial(t.params))
        # recomputed here, not read from the trial's feasibility flag
        got = device_latency(device, space, cand.arch, joint.policy(cand))[0]
        assert got <= parse_constraint(text).bound + 1e-12, (t.number, got)
        assert t.constraints[text] <= 0
    # the constraint is on a metric that is not an objective: the sampler learnt nothing of it
    # from the trials, it screened the candidates with the cheap latency


def test_learned_constraint_steers_towards_feasible_candidates():
    """A constraint on accuracy (not cheap) is learned from the trials' constraint values. Here
    it works against the accuracy objective on purpose (at most 80 %): the search without it
    climbs to the most accurate models, the search with it keeps proposing models that meet it."""

    def share_feasible(cfg: SearchConfig) -> float:
        study, _ = synthetic_search(cfg, 30)
        return float(np.mean([t.values[0] <= 80 for t in study.trials[5:]]))

    constrained = share_feasible(_cfg(constraints=["accuracy<=80"]))
    free = share_feasible(_cfg())
    assert constrained >= free + 0.3, (constrained, free)


def test_same_seed_same_search_other_seed_other_search():
    def params(seed: int) -> list[dict]:
        study, _ = synthetic_search(_cfg(seed=seed), 12)
        return [t.params for t in study.trials]

    a = params(0)
    assert params(0) == a
    assert params(1) != a


def test_two_learned_objectives_use_the_exact_ehvi_and_beat_random():
    """Accuracy against a latency measured here: both learned, the second as an uncertain
    cost of the 2-D EHVI."""
    from test_search_screening import ToySpace, run_toy, toy_hv_ratio

    space = ToySpace()

    def screening(seed: int) -> ScreeningSampler:
        return ScreeningSampler(space, None, (), seed=seed,
                                directions=["maximize", "minimize"])

    first = run_toy(space, screening(0), 30)
    assert run_toy(space, screening(0), 30) == first and len(set(first)) == 30
    ours = np.mean([toy_hv_ratio(run_toy(space, screening(s), 30)) for s in range(3)])
    rand = np.mean([toy_hv_ratio(run_toy(space, optuna.samplers.RandomSampler(seed=s), 30))
                    for s in range(3)])
    assert ours > rand + 0.03, (ours, rand)


def test_seeds_run_first_and_the_arch_only_search_uses_the_space():
    space = get_space("mbv3-tiny")
    seeds = [space.to_params(space.largest()), space.to_params(space.smallest())]
    study, joint = synthetic_search(_cfg(bits=False), 9, seeds=seeds)
    assert joint is None
    assert [t.params for t in study.trials[:2]] == seeds
    assert all("bits:stem_conv" not in t.params for t in study.trials)
    assert len({t.user_attrs["arch"] for t in study.trials}) == 9


def test_arch_bits_candidates_round_trip_and_ignore_absent_groups():
    space = get_space("mbv3-tiny")
    joint = ArchBitsSpace(space, [4, 8, 32])
    small = space.smallest()  # depth 1 per stage: later blocks are absent
    groups = joint.groups
    a = ArchBits(small, tuple(8 for _ in groups))
    absent = [i for i, on in enumerate(joint.active(small)) if not on]
    assert absent
    b = ArchBits(small, tuple(4 if i in absent else 8 for i in range(len(groups))))
    assert joint.to_string(a) == joint.to_string(b)
    assert np.array_equal(joint.encode(a), joint.encode(b))
    assert joint.policy(a) == joint.policy(b)
    back = joint.from_string(joint.to_string(b))
    assert joint.to_string(back) == joint.to_string(b)
    assert joint.suggest(optuna.trial.FixedTrial(joint.to_params(b))) == b
    assert len(joint.encode(a)) == len(joint.feature_names) == space.feature_dim + len(groups)
    with pytest.raises(UserError, match="bit choices"):
        joint.from_string(joint.to_string(a).replace("=8", "=6", 1))


def test_cheap_metrics_equal_what_the_trial_reports():
    space = get_space("mbv3-tiny")
    joint = ArchBitsSpace(space, [4, 6, 8, 32])
    devices = {d: get_device(d, space) for d in (DEVICE, "fpga-zcu102-est")}
    metrics = [Metric("size"), Metric("bops"), Metric("latency", DEVICE),
               Metric("latency", "fpga-zcu102-est")]
    cands = [joint.sample(np.random.default_rng(i)) for i in range(5)]
    pairs = [(c.arch, joint.policy(c)) for c in cands]
    values, std = CheapMetrics(space, devices, metrics)(pairs)
    evaluator = SyntheticEvaluator(space, list(devices))
    for row, (arch, policy) in zip(values, pairs):
        m = evaluator(arch, policy)
        assert list(row) == [m[x.column] for x in metrics]
    assert (std == 0).all()
    with pytest.raises(UserError, match="needs an evaluation"):
        CheapMetrics(space, devices, [Metric("accuracy")])


def test_screening_needs_its_problem_and_an_expensive_objective():
    with pytest.raises(UserError, match="needs the search problem"):
        make_sampler("screening", 0)
    with pytest.raises(UserError, match="have none"):
        _cfg(objectives=f"size,latency:{DEVICE}", sampler="screening")


# -- the command line -----------------------------------------------------------------------


def test_cli_screening_searches_arch_and_bits_writes_outputs_and_resumes(tmp_path: Path,
                                                                         checkpoint: Path):
    args = ["search", "--supernet", str(checkpoint), "--sampler", "screening",
            "--devices", DEVICE, "--objectives", f"accuracy,latency:{DEVICE}",
            "--out", str(tmp_path), "--name", "s", "--quiet"]
    # 6 seeds + 10 random start-up trials, then the surrogate chooses
    assert main([*args, "--trials", "18"]) == 0
    run = tmp_path / "s"
    for name in ("config.json", "study.db", "trials.csv", "trials.parquet",
                 f"pareto_{DEVICE}.csv", "hypervolume.csv", "fronts.png"):
        assert (run / name).is_file(), name
    first = pd.read_csv(run / "trials.csv", keep_default_na=False)
    assert len(first) == 18
    assert json.loads((run / "config.json").read_text())["sampler"] == "screening"
    # the seeds ran first
    assert list(first["seed"][:4]) == ["largest-float", "largest-int8", "smallest-float",
                                       "smallest-int8"]
    assert (first["seed"][6:] == "").all()
    searched = first.iloc[6:]
    assert searched["policy"].nunique() > 1 and searched["arch"].nunique() > 1
    assert not first.duplicated(["arch", "policy"]).any()
    assert "param:bits:stem_conv" in first.columns
    # rerunning the command with a larger budget continues the study
    assert main([*args, "--trials", "20"]) == 0
    second = pd.read_csv(run / "trials.csv", keep_default_na=False)
    assert sorted(second["trial"]) == list(range(20))
    pd.testing.assert_frame_equal(first[["trial", "arch", "policy", "accuracy"]],
                                  second[["trial", "arch", "policy", "accuracy"]].head(18))
    assert not second.duplicated(["arch", "policy"]).any()


def test_api_accepts_screening(tmp_path: Path, checkpoint: Path, one_torch_thread):
    from hwnas import search

    result = search.run(supernet=str(checkpoint), sampler="screening", bits=False, trials=4,
                        objectives=f"accuracy,latency:{DEVICE}", devices=[DEVICE],
                        out=str(tmp_path), name="api", progress=False, log=lambda *a: None)
    assert len(result.trials) == 4 and set(result.fronts) == {DEVICE}
    assert (result.trials["policy"] == "").all()


def test_cli_rejects_screening_without_an_expensive_objective(tmp_path: Path):
    assert main(["search", "--sampler", "screening", "--objectives", f"size,latency:{DEVICE}",
                 "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert not (tmp_path / "o").exists()


def test_build_sampler_for_a_search():
    """The sampler the search builds: seeds extend its start-up, the pool is the search's."""
    space = get_space("mbv3-tiny")
    cfg = _cfg(sampler="screening")
    sampler = build_sampler(cfg, space, SyntheticEvaluator(space, cfg.all_devices), n_seeds=6)
    assert isinstance(sampler, ScreeningSampler)
    assert sampler.config.n_startup_trials == 16
    assert isinstance(sampler.space, ArchBitsSpace)
    assert sampler.cheap_indices == (1,)
