"""Settings a search can tell are meaningless before it starts: constraints written twice in
two spellings, impossible on their face or ruled out by the cheap metrics of the whole space,
contradictory flags, implausible measured latencies."""

from __future__ import annotations

import pytest
from hwnas.search.config import SearchConfig
from hwnas.search.evaluator import check_cheap_bounds
from hwnas.search.objectives import parse_constraint, parse_constraints
from hwnas.supernet.spaces import get_space

from hwnas.core.errors import UserError


def test_constraints_are_written_one_way():
    assert parse_constraint(" size <= 200KiB ").text == "size<=200KiB"
    cfg = SearchConfig(constraints=["size <= 200KiB"], devices=["edgetpu-est"])
    cfg.validate()
    assert cfg.constraints == ["size<=200KiB"]


@pytest.mark.parametrize("specs, message", [
    (["size<=200KiB", "size <= 200KiB"], "given twice"),
    (["size<=200KiB", "size<=204800"], "given twice"),
    (["latency:edgetpu-est<=-1ms"], "cannot be met"),
    (["latency:edgetpu-est<=0"], "cannot be met"),
    (["accuracy>=200"], "cannot be met"),
    (["accuracy<=-1"], "cannot be met"),
    (["size<=100KiB", "size>=200KiB"], "cannot both be met"),
])
def test_impossible_or_repeated_constraints_are_refused(specs, message):
    with pytest.raises(UserError, match=message):
        parse_constraints(specs)


def test_compatible_constraints_pass():
    assert len(parse_constraints(["size>=100KiB", "size<=200KiB", "accuracy>=0"])) == 3


@pytest.mark.parametrize("spec", ["size<=1KiB", "latency:edgetpu-est<=1us", "flops>=1G"])
def test_cheap_bounds_of_the_space_rule_out_a_constraint(spec):
    space = get_space("mbv3-tiny")
    with pytest.raises(UserError, match="rules out every candidate"):
        check_cheap_bounds(space, parse_constraints([spec]), bits=True, bit_choices=[4, 8, 32])


def test_cheap_bounds_keep_a_constraint_some_member_meets():
    space = get_space("mbv3-tiny")
    check_cheap_bounds(space, parse_constraints(["size<=100KiB", "accuracy>=99"]), bits=True,
                       bit_choices=[4, 8, 32])
    check_cheap_bounds(space, parse_constraints(["size<=100KiB"]), bits=False)


def test_no_bits_with_bit_choices_is_contradictory():
    with pytest.raises(UserError, match="--no-bits"):
        SearchConfig(bits=False, bit_choices=[4], devices=["edgetpu-est"]).validate()
    SearchConfig(bits=False, devices=["edgetpu-est"]).validate()


@pytest.mark.parametrize("value", ["1e300", "1e-9", "4000000"])
def test_implausible_measured_latencies_are_refused(tmp_path, value):
    from hwnas.latency.profiles import read_measurements

    space = get_space("nb201")
    arch = space.to_string(space.largest())
    path = tmp_path / "m.csv"
    path.write_text(f"arch,latency_ms\n{arch},{value}\n")
    with pytest.raises(UserError, match="line 2: latency_ms is .* not a plausible latency"):
        read_measurements(path, space)
    path.write_text(f"arch,latency_ms\n{arch},2.5\n")
    assert read_measurements(path, space).latency_ms.tolist() == [2.5]
