"""Where the shared reference data lives (CIFAR-10, latency tables, NAS-Bench-201 accuracies).

One rule for every package: ``$HWNAS_SHARED_DATA`` when set, else ``shared/data`` beside the
checkout. Data is kept outside the checkout so it is never committed. No torch here, so that
listing devices or tables stays light."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["SHARED_DATA_ENV", "shared_data_candidate", "shared_data_dir"]

#: Environment variable that points at the shared reference-data directory.
SHARED_DATA_ENV = "HWNAS_SHARED_DATA"


def shared_data_candidate() -> tuple[Path, str]:
    """The shared-data directory to look in (whether or not it exists), and a phrase saying
    where that choice came from, for error messages."""
    env = os.environ.get(SHARED_DATA_ENV)
    if env:
        return Path(env).expanduser(), f"${SHARED_DATA_ENV}"
    repo_root = Path(__file__).resolve().parents[2]  # hwnas/core/paths.py -> the checkout
    return repo_root.parent / "shared" / "data", "the default beside the checkout"


def shared_data_dir() -> Path | None:
    """The shared reference-data directory, or ``None`` if it does not exist.

    ``$HWNAS_SHARED_DATA`` when set, else ``<checkout>/../shared/data``; callers and tests skip
    or explain when it is missing.

    Examples:
        >>> from hwnas.supernet import shared_data_dir
        >>> path = shared_data_dir()    # None where the reference data is absent
        >>> path is None or (path / "README.md").exists()
        True
    """
    path, _ = shared_data_candidate()
    return path if path.is_dir() else None
