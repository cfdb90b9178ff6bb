"""MkDocs hook: lay out the package as it is installed, for mkdocstrings.

The checkout maps its top-level folders onto ``hwnas.*`` subpackages (``package-dir`` in
pyproject.toml), which griffe, reading source files, cannot follow. Before the build this lays
out ``.docs-src/hwnas/`` as the wheel does, out of symlinks to the checkout's files, and
mkdocstrings reads the sources from there (``paths`` in mkdocs.yml).
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / ".docs-src"


def lay_out() -> Path:
    """``.docs-src/hwnas/...``: the installed layout of the package, as symlinks."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    if TREE.exists():
        shutil.rmtree(TREE)
    top = TREE / "hwnas"
    top.mkdir(parents=True)
    for entry in (ROOT / mapping["hwnas"]).iterdir():
        if entry.name != "__pycache__":
            (top / entry.name).symlink_to(entry)
    for package, folder in mapping.items():
        if package != "hwnas":
            (TREE / package.replace(".", "/")).symlink_to(ROOT / folder)
    return TREE


def on_startup(**kwargs) -> None:
    lay_out()
