"""The declared public API: ``hwnas.__all__`` and each subpackage's ``__all__`` list what is
supported; every listed name resolves, has a docstring with a short example, and the example
runs (doctest). Names importable but not listed are internal and may change.

Examples that need a finished run or a trained supernet use ``run_dir`` (a small finished
search of the one-epoch digits supernet, tests/conftest.py's ``small_run``) and ``checkpoint``
(that supernet's file), which the docs name as such; examples reading the shared reference data
(HELP's latency tables) are skipped, with the reason, where it is absent.

The examples run here rather than through ``pytest --doctest-modules``: the subpackages live in
top-level folders mapped by ``package-dir``, which pytest's module collection would import under
the folder names (``supernet.spaces``) instead of ``hwnas.supernet.spaces``.
"""

from __future__ import annotations

import doctest
import importlib
import inspect

import pytest

#: the modules whose ``__all__`` is the supported API (the docs' API reference lists the same)
PUBLIC_MODULES = ("hwnas", "hwnas.supernet", "hwnas.latency", "hwnas.quant", "hwnas.search",
                  "hwnas.export")


def _public() -> list[tuple[str, str, object]]:
    out, seen = [], set()
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if not (inspect.isclass(obj) or inspect.isroutine(obj)) or id(obj) in seen:
                continue  # constants (__version__, SUPPORTED_BITS) carry no docstring
            seen.add(id(obj))
            out.append((module_name, name, obj))
    return out


PUBLIC = _public()


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_every_listed_name_resolves(module_name):
    module = importlib.import_module(module_name)
    assert module.__all__, f"{module_name} declares no public names"
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert not missing, f"{module_name}.__all__ lists names it does not have: {missing}"


@pytest.mark.parametrize("module_name,name,obj", PUBLIC,
                         ids=[f"{m}.{n}" for m, n, _ in PUBLIC])
def test_public_name_has_a_running_example(module_name, name, obj, tmp_path, monkeypatch, request):
    from hwnas.supernet import spaces

    doc = inspect.getdoc(obj) or ""
    assert doc.strip(), f"{module_name}.{name} has no docstring"
    assert ">>>" in (obj.__doc__ or ""), f"{module_name}.{name}'s docstring has no example"
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("HWNAS_DEVICE_DIR", str(tmp_path / "devices"))
    if "load_shared_table" in obj.__doc__ or "help_protocol(" in obj.__doc__:
        from hwnas.latency.devices import latency_tables as present
        if not present():
            pytest.skip("the example reads HELP's latency tables of the shared data "
                        "($HWNAS_SHARED_DATA or ../shared/data), absent here")
    before = set(spaces.SPACES)  # register_space's example registers a space: taken back after
    request.addfinalizer(lambda: [spaces.SPACES.unregister(n) for n in set(spaces.SPACES) - before])
    globs = {}
    if "run_dir" in obj.__doc__:
        globs["run_dir"] = str(request.getfixturevalue("small_run"))
    if "checkpoint" in obj.__doc__:
        globs["checkpoint"] = str(request.getfixturevalue("digits_checkpoint"))
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = finder.find(obj, f"{module_name}.{name}", globs=globs)
    assert tests and any(t.examples for t in tests)
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{module_name}.{name}: {result.failed} example(s) failed (above)"


def test_the_notebooks_use_only_listed_names():
    """The tutorials (notebooks/) import from the public modules only names they list."""
    import ast
    import json
    from pathlib import Path

    unlisted = []
    for path in sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        code = "\n".join(line for c in cells if c["cell_type"] == "code"
                         for line in "".join(c["source"]).splitlines() if not line.startswith("%"))
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.ImportFrom) and node.module in PUBLIC_MODULES:
                listed = importlib.import_module(node.module).__all__
                unlisted += [f"{path.name}: {node.module}.{a.name}" for a in node.names
                             if a.name not in listed and a.name != "search"]
    assert not unlisted, unlisted
