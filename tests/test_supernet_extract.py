"""Supernet.extract, the one implementation every supernet inherits: it leaves the supernet as
it was, returns an eval-mode copy, and gives, bit for bit, the subnets the four per-space
``extract()`` methods gave before they were merged into the base (digests of the state_dicts
of seeded supernets' largest, smallest and one random subnet; a deliberate change to a space's
weights or initialisation updates them)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hwnas.supernet.nn.supernet import Supernet  # noqa: E402
from hwnas.supernet.spaces import get_space  # noqa: E402

#: sha256 (first 16 hex digits) of the extracted subnets' state_dicts, by space: largest,
#: smallest, the first sample of default_rng(5); supernets built after torch.manual_seed(1)
DIGESTS = {
    "mbv3-tiny": ('e5c608d0f88c5406', '7f67fb6eeea5820e', '6c09baec8e5714fc'),
    "mbv3": ('6f31ccad2b90878e', 'bd3340580ed325ce', '8b0bcf29324d52e1'),
    "fbnet": ('db331d51be9f6b0d', 'beb015ff2ba7396e', '883eeaa883cfc7bb'),
    "nb201": ('e86121f61a396d87', '5395a1c90b69490d', '05e25c8d6c0c9812'),
    "vit": ('98b9af3ab561be17', '6c3442599e19809b', 'de36a3b0d30eaf98'),
    # cct: no Q/K/V bias since session 30 (CCT has none)
    "cct": ('9a3d64ba9b153b45', '639566e8a55c522d', 'a0dab27d1e674f37'),
}


def _digest(state: dict) -> str:
    h = hashlib.sha256()
    for key in sorted(state):
        value = state[key].detach().cpu().contiguous()
        h.update(key.encode())
        h.update(str(value.dtype).encode())
        h.update(str(tuple(value.shape)).encode())
        h.update(value.numpy().tobytes())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(DIGESTS))
def test_extract_gives_the_same_subnets_as_before(name: str) -> None:
    space = get_space(name)
    torch.manual_seed(1)
    supernet = space.build_supernet()
    assert isinstance(supernet, Supernet)
    rng = np.random.default_rng(5)
    archs = [space.largest(), space.smallest(), space.sample(rng)]
    before = {k: v.clone() for k, v in supernet.state_dict().items()}
    supernet.set_active(space.smallest())
    got = []
    for arch in archs:
        sub = supernet.extract(arch)
        assert not sub.training and not isinstance(sub, Supernet)
        got.append(_digest(sub.state_dict()))
    assert tuple(got) == DIGESTS[name]
    # the supernet is left as it was: same active subnet, same weights
    assert space.to_string(supernet.active_arch()) == space.to_string(space.smallest())
    assert all(torch.equal(v, before[k]) for k, v in supernet.state_dict().items())
