"""The README's quick start and .ci/run must say the same thing."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def quick_start_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.strip().splitlines()]


def test_quick_start_has_three_commands():
    commands = quick_start_commands()
    assert len(commands) == 3
    assert commands[1] == "hwnas run"


def test_ci_runs_the_readme_install_and_test_commands():
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    install, _, test = quick_start_commands()
    assert install in ci_lines
    assert test in ci_lines
    assert ci_lines.index(install) < ci_lines.index(test)
