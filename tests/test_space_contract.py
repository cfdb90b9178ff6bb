"""The SearchSpace contract, checked for every space of the registry (``available_spaces()``
when the tests are collected) and for a user's own space registered here with ``register_space``
(``USER_SPACE``: a narrow NAS-Bench-201 network), so a user's space meets the same checks.

What every part of the toolkit relies on: canonical strings round-trip and identify an
architecture, bad strings are refused with a UserError, encodings have ``feature_dim`` columns,
the smallest and largest members bound the space's cost, ``suggest`` reproduces an architecture
from its parameters, the layer list is made of Layer records, the declaration imports without
torch, and the supernet's extracted subnet computes what the supernet computes."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hwnas.supernet.layers import Layer
from hwnas.supernet.spaces import (
    SPACES,
    NB201Config,
    NB201Space,
    available_spaces,
    get_space,
    register_space,
)
from optuna.trial import FixedTrial
from registry_support import contract_entry

from hwnas.core.errors import UserError

N_SAMPLES = 40


#: A user's own space (a narrow NAS-Bench-201 network), registered by name as a user would.
USER_SPACE = "user-nb201-narrow"


def narrow_nb201(*, in_channels=None, image_size=None, num_classes=None, config=None):
    cfg = NB201Config.from_dict(config) if config else NB201Config(init_channels=8,
                                                                    cells_per_stage=1)
    given = dict(in_channels=in_channels, image_size=image_size, num_classes=num_classes)
    return NB201Space(replace(cfg, **{k: v for k, v in given.items() if v is not None}),
                      name=USER_SPACE)


def contract_spaces() -> list[str]:
    return [*available_spaces(), USER_SPACE]


@pytest.fixture(scope="module", params=contract_spaces())
def space(request):
    return get_space(contract_entry(request, USER_SPACE, register_space, narrow_nb201, SPACES))


@pytest.fixture(scope="module")
def samples(space):
    rng = np.random.default_rng(0)
    return [space.sample(rng) for _ in range(N_SAMPLES)]


def test_declaration_imports_without_torch(space) -> None:
    user = (f"sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_space_contract as t; "
            f"t.register_space(t.USER_SPACE, t.narrow_nb201); ") if space.name == USER_SPACE else ""
    code = (f"import sys; {user}from hwnas.supernet.spaces import get_space; "
            f"s = get_space({space.name!r}); s.layers(s.largest()); s.encode(s.smallest()); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_strings_round_trip_and_identify_an_architecture(space, samples) -> None:
    for arch in samples + [space.smallest(), space.largest()]:
        text = space.to_string(arch)
        assert isinstance(text, str) and text
        assert space.from_string(text) == arch and space.to_string(arch) == text
        assert space.parse(text) == arch and space.parse(arch) == arch
    strings = {space.to_string(a) for a in samples}
    encodings = {space.encode(a).tobytes() for a in samples}
    assert len(encodings) == len(strings)  # one encoding per distinct architecture


@pytest.mark.parametrize("text", ["", "not an architecture", "|||", "x" * 500])
def test_bad_strings_are_user_errors(space, text: str) -> None:
    with pytest.raises(UserError):
        space.from_string(text)


def test_non_string_is_a_user_error(space) -> None:
    with pytest.raises(UserError):
        space.from_string(12345)  # type: ignore[arg-type]


def test_encoding_has_feature_dim_columns(space, samples) -> None:
    names = space.feature_names
    assert len(names) == space.feature_dim == len(set(names))
    for arch in samples:
        x = space.encode(arch)
        assert x.shape == (space.feature_dim,) and np.issubdtype(x.dtype, np.floating)
        assert np.isfinite(x).all()


def test_smallest_and_largest_bound_the_cost(space, samples) -> None:
    lo, hi = space.smallest(), space.largest()
    for metric in (space.flops, space.params):
        assert metric(lo) < metric(hi)
        values = [metric(a) for a in samples]
        assert metric(lo) <= min(values) and max(values) <= metric(hi)


def test_suggest_reproduces_an_architecture_from_its_parameters(space, samples) -> None:
    keys = set(space.to_params(space.largest()))
    for arch in samples[:20] + [space.smallest(), space.largest()]:
        params = space.to_params(arch)
        assert set(params) == keys  # one parameter set for every trial (multivariate samplers)
        assert space.suggest(FixedTrial(params)) == arch


def test_layer_list_is_plain_records(space, samples) -> None:
    for arch in samples[:10]:
        layers = space.layers(arch)
        assert layers and all(isinstance(layer, Layer) for layer in layers)
        assert len({layer.name for layer in layers}) == len(layers)
        assert space.flops(arch) > 0 and space.params(arch) > 0


def test_config_round_trips_through_get_space(space) -> None:
    again = get_space(space.name, config=space.config())
    assert again.config() == space.config()
    assert again.to_string(again.largest()) == space.to_string(space.largest())


def test_extracted_subnet_computes_what_the_supernet_computes(space) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = space.build_supernet().eval()
    x = torch.randn(2, *space.input_shape)
    for arch in (space.smallest(), space.sample(np.random.default_rng(3))):
        net.set_active(arch)
        with torch.no_grad():
            expected = net(x)
            got = net.extract(arch).eval()(x)
        assert got.shape == (2, space.num_classes)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_execution_variants_give_architectures_of_the_space(space, samples) -> None:
    variants = space.execution_variants()
    assert variants[0] == "raw"
    for arch in samples[:10]:
        assert space.executed(arch, "raw") == (arch, False)
        for variant in variants:
            ran, constant = space.executed(arch, variant)
            assert space.parse(space.to_string(ran)) == ran and isinstance(constant, bool)
            assert space.flops(ran) <= space.flops(arch)
    with pytest.raises(UserError, match="execution variant"):
        space.executed(samples[0], "no-such-variant")
