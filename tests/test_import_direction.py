"""Imports only point down the layers of ARCHITECTURE.md: core → spaces → supernet (data,
training) → latency, quant (side by side) → search → export → the top floor (the package facade
``hwnas``, ``hwnas.api``, ``hwnas.cli``).

The graph is read from the source (every ``import`` / ``from ... import`` of an ``hwnas``
module, at any depth, lazy ones included), so a new upward or sideways arrow fails here unless
it is named in :data:`ALLOWED` with its reason, and files that import each other in a circle
(package faces included) fail unless the circle is named in :data:`ALLOWED_CIRCLES`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"hwnas": ROOT / "hwnas", "hwnas.supernet": ROOT / "supernet",
           "hwnas.latency": ROOT / "latency", "hwnas.quant": ROOT / "quant",
           "hwnas.search": ROOT / "search", "hwnas.export": ROOT / "export"}

#: (prefix, layer): the longest matching prefix decides a module's layer.
LAYERS = [
    ("hwnas.core", 0),
    ("hwnas.supernet.space", 1), ("hwnas.supernet.layers", 1), ("hwnas.supernet.spaces", 1),
    ("hwnas.supernet", 2),
    ("hwnas.latency", 3), ("hwnas.quant", 3),
    ("hwnas.search", 4),
    ("hwnas.export", 5),
    # the top floor: the package facade ``hwnas`` (its lazy ``load_run``/``Run`` reach
    # hwnas.api), the notebook facade hwnas.api (it reaches every layer below) and the command
    # line; nothing below may import them (``__version__`` is hwnas.core.version's)
    ("hwnas.api", 6), ("hwnas.cli", 6), ("hwnas.__main__", 6), ("hwnas", 6),
]
#: Packages of one layer that must not import each other (side by side).
SIDEWAYS = {3: ("hwnas.latency", "hwnas.quant")}

#: (importer, imported) arrows that break the layering on purpose, each with its reason.
_BUILDS = ("a space builds its own supernet on demand: the import sits inside build_supernet(), "
           "so the declaration itself stays torch-free")
ALLOWED: dict[tuple[str, str], str] = {
    ("hwnas.supernet.spaces.mbv3", "hwnas.supernet.nn.mbv3"): _BUILDS,
    ("hwnas.supernet.spaces.fbnet", "hwnas.supernet.nn.fbnet"): _BUILDS,
    ("hwnas.supernet.spaces.nb201", "hwnas.supernet.nn.nb201"): _BUILDS,
    ("hwnas.supernet.spaces.vit", "hwnas.supernet.nn.vit"): _BUILDS,
}


def _modules() -> dict[str, Path]:
    out = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def layer_of(module: str) -> tuple[int, str]:
    best = max((p for p, _ in LAYERS if module == p or module.startswith(p + ".")), key=len)
    layer = dict(LAYERS)[best]
    group = next((g for g in SIDEWAYS.get(layer, ()) if module == g or module.startswith(g + ".")),
                 best)
    return layer, group


def imports_of(module: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "hwnas")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.split(".")[0] == "hwnas":
                # ``from hwnas.x import y`` may import the submodule hwnas.x.y
                found.update(f"{name}.{a.name}" for a in node.names)
                found.add(name)
    return found


def violations() -> set[tuple[str, str]]:
    mods = _modules()
    bad = set()
    for module, path in mods.items():
        src_layer, src_group = layer_of(module)
        for target in imports_of(module, path):
            while target not in mods and "." in target:  # ``from m import name``: the module m
                target = target.rpartition(".")[0]
            if target not in mods or target == module:
                continue
            dst_layer, dst_group = layer_of(target)
            upward = dst_layer > src_layer
            sideways = dst_layer == src_layer and src_layer in SIDEWAYS and dst_group != src_group
            if upward or sideways:
                bad.add((module, target))
    return bad


def test_the_graph_is_read() -> None:
    mods = _modules()
    assert "hwnas.search.runner" in mods and "hwnas.cli" in mods
    assert "hwnas.supernet.train" in imports_of("hwnas.search.runner", mods["hwnas.search.runner"])
    assert layer_of("hwnas.supernet.spaces.mbv3") == (1, "hwnas.supernet.spaces")
    assert layer_of("hwnas.quant.ptq")[1] != layer_of("hwnas.latency.devices")[1]
    assert layer_of("hwnas")[0] == layer_of("hwnas.api")[0] > layer_of("hwnas.export.finetune")[0]
    assert layer_of("hwnas.core.version")[0] == 0


def test_imports_only_point_down() -> None:
    found = violations()
    new = sorted(found - ALLOWED.keys())
    assert not new, "imports against the layering (ARCHITECTURE.md):\n" + "\n".join(
        f"  {a} -> {b}" for a, b in new)


@pytest.mark.parametrize("arrow", sorted(ALLOWED))
def test_allowlisted_arrows_still_exist(arrow: tuple[str, str]) -> None:
    assert arrow in violations(), f"{arrow} no longer exists: remove it from ALLOWED"


#: Circles between files (strongly connected groups of the import graph, package faces
#: included) that exist on purpose, each with its reason. Any other circle fails.
ALLOWED_CIRCLES: dict[frozenset[str], str] = {
    frozenset({f"hwnas.supernet.spaces.{s}", f"hwnas.supernet.nn.{s}"}): _BUILDS
    + "; the torch module imports its declaration's config and choices"
    for s in ("mbv3", "fbnet", "nb201", "vit")
}


def circles() -> list[frozenset[str]]:
    """The strongly connected groups of more than one file (Tarjan's algorithm)."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in mods.items():
        edges = set()
        for target in imports_of(module, path):
            while target not in mods and "." in target:
                target = target.rpartition(".")[0]
            if target in mods and target != module:
                edges.add(target)
        graph[module] = edges
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(frozenset(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_circles_between_files() -> None:
    new = [sorted(c) for c in circles() if c not in ALLOWED_CIRCLES]
    assert not new, f"files that import each other in a circle: {new}"


@pytest.mark.parametrize("circle", sorted(ALLOWED_CIRCLES, key=sorted), ids=lambda c: min(c))
def test_allowlisted_circles_still_exist(circle: frozenset[str]) -> None:
    assert circle in circles(), f"{sorted(circle)} is no longer a circle: remove it"
