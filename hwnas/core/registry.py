"""One registry pattern for everything selectable by name: spaces, devices, predictors,
estimators, samplers.

A :class:`Registry` maps a name to a factory (a class or a function). Built-in entries are
registered by the package that owns them; a user's entry goes through the same ``register``
call and so meets the same contract tests (``tests/test_registries.py``). Unknown names get one
:class:`UserError` line with the close matches.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from hwnas.core.errors import UserError

F = TypeVar("F", bound=Callable[..., Any])


class Registry(Generic[F]):
    """Name -> factory for one kind of thing (``what``: "space", "device", ...).

    ``register(name, factory)`` adds an entry (a built-in name cannot be replaced, a user's
    entry may be re-registered or removed with ``unregister``); ``get(name)`` returns the factory or raises one UserError line;
    ``names()`` lists them sorted.

    Examples:
        >>> from hwnas.core.registry import Registry
        >>> colours = Registry("colour")
        >>> colours.register("red", lambda: (255, 0, 0), builtin=True)
        >>> colours.get("red")()
        (255, 0, 0)
        >>> colours.get("rde")
        Traceback (most recent call last):
        ...
        hwnas.core.errors.UserError: unknown colour 'rde' (did you mean 'red'?); expected one of ['red']
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self._entries: dict[str, F] = {}
        self._builtin: set[str] = set()
        self._info: dict[str, dict[str, Any]] = {}

    def register(self, name: str, factory: F, *, builtin: bool = False, **info: Any) -> None:
        """Add ``name``; ``info`` is free metadata a caller may read back with :meth:`info`."""
        if not isinstance(name, str) or not name.strip():
            raise UserError(f"{self.what} name {name!r}; expected a non-empty string")
        if not callable(factory):
            raise UserError(f"{self.what} {name!r}: the factory {factory!r} is not callable")
        if name in self._builtin and not builtin:
            raise UserError(f"{self.what} name {name!r} is taken by a built-in {self.what}")
        self._entries[name] = factory
        self._info[name] = dict(info)
        if builtin:
            self._builtin.add(name)

    def unregister(self, name: str) -> None:
        """Remove a user's entry (a test's, or one registered by mistake); built-ins stay."""
        self.get(name)
        if name in self._builtin:
            raise UserError(f"{self.what} {name!r} is built in; only a user's entry can be removed")
        del self._entries[name], self._info[name]

    def get(self, name: str) -> F:
        if name not in self._entries:
            close = difflib.get_close_matches(str(name), list(self._entries), n=3, cutoff=0.4)
            hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
            raise UserError(f"unknown {self.what} {name!r}{hint}; expected one of {self.names()}")
        return self._entries[name]

    def info(self, name: str) -> dict[str, Any]:
        self.get(name)
        return dict(self._info[name])

    def is_builtin(self, name: str) -> bool:
        return name in self._builtin

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}, {self.names()})"
