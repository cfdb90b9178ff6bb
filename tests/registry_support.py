"""Helper of the contract tests that run over a registry (spaces, predictors, estimators,
samplers): each also checks a user's own entry, registered as a user would register it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hwnas.core.registry import Registry


def contract_entry(request: Any, user: str, register: Callable[[str, Any], None],
                   factory: Any, registry: Registry) -> str:
    """The name a contract fixture's ``request.param`` stands for; for ``user``, first
    ``register(user, factory)`` (the public ``register_*`` call), taken back from ``registry``
    when the fixture's scope ends."""
    if request.param == user:
        register(user, factory)
        request.addfinalizer(lambda: registry.unregister(user))
    return request.param
