"""hwnas.core.registry.Registry: the one name -> factory pattern of spaces, devices, predictors,
estimators and samplers (their own contract tests check what a registered entry must do)."""

from __future__ import annotations

import pytest

from hwnas.core.errors import UserError
from hwnas.core.registry import Registry


def make() -> Registry:
    reg = Registry("colour")
    reg.register("red", lambda: (255, 0, 0), builtin=True, hex="#f00")
    reg.register("green", lambda: (0, 255, 0), builtin=True)
    return reg


def test_get_returns_the_factory_and_lists_sorted_names():
    reg = make()
    assert reg.get("red")() == (255, 0, 0)
    assert reg.names() == ["green", "red"] == list(reg)
    assert "red" in reg and "blue" not in reg and len(reg) == 2
    assert reg.info("red") == {"hex": "#f00"} and reg.info("green") == {}
    assert reg.is_builtin("red") and "colour" in repr(reg)


def test_unknown_name_is_one_user_error_line_with_close_matches():
    reg = make()
    with pytest.raises(UserError, match=r"^unknown colour 'rde' \(did you mean 'red', 'green'\?\); "
                                        r"expected one of \['green', 'red'\]$"):
        reg.get("rde")
    with pytest.raises(UserError, match=r"^unknown colour 'xyz'; expected one of"):
        reg.info("xyz")


def test_a_user_entry_may_be_replaced_and_removed_a_builtin_may_not():
    reg = make()
    reg.register("blue", lambda: (0, 0, 255))
    reg.register("blue", lambda: (0, 0, 254), shade="dark")
    assert reg.get("blue")() == (0, 0, 254) and not reg.is_builtin("blue")
    assert reg.info("blue") == {"shade": "dark"}
    reg.unregister("blue")
    assert "blue" not in reg and reg.names() == ["green", "red"]
    with pytest.raises(UserError, match="taken by a built-in colour"):
        reg.register("red", lambda: (1, 0, 0))
    with pytest.raises(UserError, match="built in"):
        reg.unregister("red")
    with pytest.raises(UserError, match="unknown colour 'blue'"):
        reg.unregister("blue")
    assert reg.get("red")() == (255, 0, 0)


@pytest.mark.parametrize("name", ["", "  ", None, 3])
def test_bad_names_are_refused(name):
    with pytest.raises(UserError, match="expected a non-empty string"):
        make().register(name, lambda: None)  # type: ignore[arg-type]


def test_a_factory_must_be_callable():
    with pytest.raises(UserError, match="is not callable"):
        make().register("blue", (0, 0, 255))  # type: ignore[arg-type]
