"""search.evaluator: the policies of one architecture share one BatchNorm recalibration, the
scoring inputs are drawn once, and the front's test scores reuse the validation accuracy the
trial measured, all with the values each candidate scored on its own gives."""

from __future__ import annotations

import torch
from hwnas.quant.policy import uniform
from hwnas.search import evaluator as ev
from hwnas.search.evaluator import EvalSettings, TrialEvaluator, policy_text
from hwnas.supernet.evaluate import accuracy, eval_loader, recalibrated_subnet
from hwnas.supernet.spaces import get_space


def _counting(monkeypatch, name: str) -> list:
    calls: list = []
    real = getattr(ev, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(ev, name, counted)
    return calls


def test_one_recalibration_per_architecture_and_no_second_validation(digits, monkeypatch):
    space = get_space("mbv3-tiny")
    torch.manual_seed(0)
    supernet = space.build_supernet()
    settings = EvalSettings(calib_batches=2, ptq_images=64, seed=0)
    evaluator = TrialEvaluator(space, supernet, digits, ["fpga-zcu102-est"], settings)
    recal = _counting(monkeypatch, "recalibrated_subnet")
    scored = _counting(monkeypatch, "accuracy")
    small, large = space.smallest(), space.largest()
    names = [n for n, m in supernet.extract(small).named_modules()
             if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    int8 = uniform(names, 8, 8)
    rows = [evaluator(small, None), evaluator(small, int8), evaluator(large, None)]
    assert len(recal) == 2 and len(scored) == 3  # small once for its two policies

    # the values of a candidate scored alone, with loaders of its own (the code before)
    alone = recalibrated_subnet(supernet, small, digits, calib_batches=2, seed=0)
    assert accuracy(alone, eval_loader(digits, digits.val)) == rows[0]["accuracy"]
    quantized = evaluator.quantized_model(alone, int8)
    from hwnas.quant.ptq import PTQConfig, ptq
    loader = evaluator.calibration_batches()
    fresh = ptq(alone, int8, loader, PTQConfig(max_images=64, seed=0))
    for (k, a), b in zip(quantized.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), k
    assert accuracy(fresh, eval_loader(digits, digits.val)) == rows[1]["accuracy"]
    # float_model is the caller's own copy: training it leaves the kept subnet alone
    mine = evaluator.float_model(small)
    with torch.no_grad():
        next(mine.parameters()).add_(1.0)
    assert torch.equal(next(evaluator.float_model(small).parameters()),
                       next(alone.parameters()))

    recal.clear()
    scored.clear()
    small_s, large_s = space.to_string(small), space.to_string(large)
    pairs = [(small_s, policy_text(int8)), (large_s, ""), (small_s, float("nan"))]
    scores = evaluator.front_scores(pairs)
    assert len(scored) == 3  # the test split only: each validation accuracy is the trial's
    assert len(recal) == 0  # both architectures' float subnets are kept
    assert scores[(small_s, "")][0] == rows[0]["accuracy"]
    assert scores[(small_s, policy_text(int8))][0] == rows[1]["accuracy"]
    assert scores[(small_s, "")][1] == accuracy(alone, eval_loader(digits, digits.test))
    assert scores[(small_s, policy_text(int8))][1] == accuracy(
        fresh, eval_loader(digits, digits.test))
