"""The documentation site (mkdocs.yml, docs/): it builds in strict mode (a broken link, a missing
page or an API entry that cannot be collected fails), its API reference lists exactly the
declared public API, and the README stays a short map into it."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "docs"))
import gen_api  # noqa: E402


def test_api_reference_lists_the_public_api():
    pages = gen_api.pages()
    stale = [name for name, text in pages.items()
             if not (gen_api.OUT / name).is_file() or (gen_api.OUT / name).read_text() != text]
    assert not stale, f"docs/reference/api/{stale} differ from __all__: run python docs/gen_api.py"
    from test_public_api import PUBLIC_MODULES

    assert tuple(gen_api.PUBLIC_MODULES) == PUBLIC_MODULES


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason="mkdocs is not installed (the docs extra: pip install 'hwnas[docs]')")
def test_the_site_builds_in_strict_mode(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for page in ("getting-started", "how-to/new-device", "reference/cli",
                 "reference/api/hwnas.supernet", "tutorials/01_pareto_fronts"):
        assert (tmp_path / "site" / page / "index.html").is_file(), page
    api = (tmp_path / "site" / "reference" / "api" / "hwnas.supernet" / "index.html").read_text()
    assert "get_space" in api and "&gt;&gt;&gt;" in api  # docstrings with their examples


def test_the_readme_is_a_short_map_into_the_docs():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    links = re.findall(r"\]\((docs/[^)#]+)", text)
    assert links, "the README points into docs/"
    missing = [link for link in links if not (REPO / link).exists()]
    assert not missing, missing
    assert "../shared/DESIGN.md" not in text  # outside the repository
