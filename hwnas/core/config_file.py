"""Settings files for ``--config``: TOML (``tomllib``, data only: nothing in it executes) or a
run's ``config.json``. No torch here."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from hwnas.core.errors import UserError

__all__ = ["read_config_file"]


def read_config_file(path: str | Path, command: str | None = None,
                     commands: tuple[str, ...] = ()) -> tuple[dict[str, Any], dict[str, Any]]:
    """(shared, own) settings of ``path``, keys with ``-`` written as ``_``.

    ``.toml``: the top-level keys are shared by every command; the table named after
    ``command`` (``[search]``, ``[export]``...) holds its own, which override them; tables of
    other commands are skipped, and with ``commands`` given a table of another name is refused
    (a typo would otherwise drop its settings silently). ``.json``: one object of shared keys
    (e.g. a run's config.json). UserError (one line) for a missing or malformed file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--config {path}: no such file; expected a .toml settings file or a "
                        f"run's config.json")
    if path.suffix not in (".toml", ".json"):
        raise UserError(f"--config {path}: expected a .toml or .json file")
    try:
        text = path.read_text()
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"--config {path} is not valid {path.suffix[1:].upper()}: "
                        f"{str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise UserError(f"--config {path}: nested too deeply to read; a settings file holds "
                        f"top-level keys and one table per command") from None
    except OSError as exc:
        raise UserError(f"--config {path}: cannot read it ({exc.strerror or exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"--config {path}: expected a table of settings, got "
                        f"{type(data).__name__}")
    strays = [k for k, v in data.items() if isinstance(v, dict) and commands and k not in commands]
    if strays:
        raise UserError(f"--config {path}: table [{strays[0]}] is not a command; expected tables "
                        f"named after commands ({', '.join(commands)}) or top-level keys")
    shared = {k.replace("-", "_"): v for k, v in data.items() if not isinstance(v, dict)}
    section = data.get(command) if command else None
    own = {k.replace("-", "_"): v for k, v in section.items()} if isinstance(section, dict) else {}
    return shared, own
