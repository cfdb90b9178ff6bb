"""Package data as filesystem paths, found through :mod:`importlib.resources`.

Everything hwnas reads at run time (measured latency tables, shipped predictors, supernet
checkpoints, the on-device script) is package data of the subpackage that owns it, so an
installed wheel finds exactly what a checkout finds. Each package asks for its own data by its
own name (``package_path(__name__, "data")``), so no lower layer names a higher one. No torch.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

__all__ = ["package_path"]


def package_path(package: str, *parts: str) -> Path:
    """The file or folder ``parts`` inside the installed package ``package``, as a
    :class:`~pathlib.Path` (whether or not it exists).

    hwnas is installed as files (a wheel, or a checkout installed editable); a zipped import
    would give no filesystem path, and is refused.

    Examples:
        >>> p = package_path("hwnas.core", "resources.py")
        >>> p.name, p.is_file()
        ('resources.py', True)
    """
    node = files(package)
    for part in parts:
        node = node / part
    if not isinstance(node, Path):
        raise RuntimeError(f"{package} is not installed as files ({type(node).__name__}); "
                           "install hwnas from its wheel or a checkout")
    return node
