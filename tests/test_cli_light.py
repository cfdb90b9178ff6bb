"""The torch-free core: ``hwnas --help``, light commands such as ``hwnas
spaces``, and the search settings load no torch (a user's first contact must be quick)."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = "import sys; {body}; bad = [m for m in ('torch', 'pandas') if m in sys.modules]; " \
        "assert not bad, bad"


@pytest.mark.parametrize("body", [
    "from hwnas.cli import main; main(['spaces'])",
    "from hwnas.cli import build_parser; build_parser().format_help()",
    "import hwnas.search.config as c; c.SearchConfig().validate()",
    "import hwnas, hwnas.export, hwnas.latency, hwnas.supernet",
])
def test_loads_no_torch(body: str) -> None:
    proc = subprocess.run([sys.executable, "-c", CHECK.format(body=body)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_help_exits_zero_and_lists_the_commands() -> None:
    proc = subprocess.run([sys.executable, "-m", "hwnas", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for command in ("run", "search", "train", "spaces", "latency", "export", "finetune"):
        assert command in proc.stdout
