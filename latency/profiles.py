"""Device profiles: a new device from a user's own measurements, saved so later runs reuse it.

A profile is a directory ``<profiles dir>/<name>/`` (profiles dir: ``$HWNAS_DEVICE_DIR``, else
``~/.hwnas/devices``) holding

* ``profile.json`` - name, space (and its configuration), predictor name and class, creation
  time, number of measurements, SHA-256 of the measurements CSV it came from, hwnas version;
* the adapted predictor, as its own ``save(path)`` wrote it (``predictor.npz``);
* ``measurements.csv`` - the validated measurements (``arch,latency_ms``, canonical strings).

It is written whole or not at all (:func:`save_profile`) from a CSV validated row by row
(:func:`read_measurements`). Loaded profiles are devices of kind ``adapted``
(:mod:`hwnas.latency.devices`). No torch and no pandas at import time.
"""

from __future__ import annotations

import csv
import datetime as _dt
import importlib
import json
import math
import os
import re
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from hwnas.supernet.space import SearchSpace

from hwnas.core import written
from hwnas.core.errors import UserError
from hwnas.core.io import check_writable, file_sha256, read_csv_rows

__all__ = [
    "Measurements",
    "Profile",
    "PROFILE_FILE",
    "PREDICTOR_FILE",
    "MEASUREMENTS_FILE",
    "profiles_dir",
    "check_profile_name",
    "read_measurements",
    "save_profile",
    "load_profile",
    "find_profile",
    "list_profiles",
    "load_profile_predictor",
]

PROFILE_FILE = "profile.json"
PREDICTOR_FILE = "predictor.npz"
MEASUREMENTS_FILE = "measurements.csv"
#: what writes a profile directory, in its record of written files (:mod:`hwnas.core.written`)
WRITER = "latency adapt"
FORMAT = "hwnas-device-profile-1"
ENV_DIR = "HWNAS_DEVICE_DIR"

#: Packages whose predictor classes a profile may name (a profile directory must not be able to
#: import arbitrary code). Extend it to load profiles of predictors defined elsewhere.
TRUSTED_PREDICTOR_PACKAGES: list[str] = ["hwnas.latency"]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def profiles_dir() -> Path:
    """Where profiles live: ``$HWNAS_DEVICE_DIR`` if set, else ``~/.hwnas/devices``."""
    env = os.environ.get(ENV_DIR)
    return Path(env).expanduser() if env else Path.home() / ".hwnas" / "devices"


def check_profile_name(name: str) -> str:
    """Return ``name`` if it can name a profile: letters, digits, ``.``, ``_``, ``-`` (at most
    64, starting with a letter or digit) and not the name of a built-in device."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise UserError(
            f"device name {name!r} is not a valid profile name; expected letters, digits, '.', "
            f"'_' or '-' (at most 64, starting with a letter or digit)"
        )
    from hwnas.latency.devices.registry import builtin_device_names

    if name in builtin_device_names():
        raise UserError(
            f"device name {name!r} is a built-in device; choose another name for your profile "
            f"(e.g. {name + '-mine'!r})"
        )
    return name


# --------------------------------------------------------------------------------------------
# measurements
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measurements:
    """A validated measurements CSV: canonical architecture strings, their latency in ms, the
    file and its SHA-256."""

    archs: list[str]
    latency_ms: np.ndarray
    path: Path
    sha256: str
    #: the ``file`` column (the measured model files, as ``latency/ondevice.py`` writes it)
    #: when the CSV has one with an entry on every row, else None
    files: tuple[str, ...] | None = None

    def __len__(self) -> int:
        return len(self.archs)


#: the range of a plausible measured latency of one batch-1 inference, in ms (1 ns to 1 hour):
#: a value outside it is a unit mistake or a corrupt file, and would dominate any fit
MIN_LATENCY_MS = 1e-6
MAX_LATENCY_MS = 3.6e6


def read_measurements(path: str | Path, space: SearchSpace, *, min_rows: int = 1) -> Measurements:
    """Read and validate a measurements CSV (header with at least ``arch,latency_ms``).

    Every architecture must parse in ``space`` (it is canonicalised), appear once, and have a
    finite latency > 0; at least ``min_rows`` rows. Anything else raises :class:`UserError`
    naming the file line (the header is line 1). Extra columns (``p95_ms``, ``cv``, ``file``
    as the measurement script writes them) are ignored, except that ``file`` is kept
    (:attr:`Measurements.files`: it tells whether the models were ONNX files).
    """
    path = Path(path)
    numbered = read_csv_rows(path, "measurements file",
                             "expected a CSV with columns arch,latency_ms",
                             empty="expected a header arch,latency_ms and one row per architecture")
    header = [h.strip() for h in numbered[0][1]]
    missing = [c for c in ("arch", "latency_ms") if c not in header]
    if missing:
        raise UserError(
            f"measurements file {path} lacks column(s) {', '.join(missing)} (header: "
            f"{','.join(header)}); expected a header with arch,latency_ms"
        )
    ia, il = header.index("arch"), header.index("latency_ms")
    i_file = header.index("file") if "file" in header else None
    files: list[str] = []
    archs: list[str] = []
    values: list[float] = []
    seen: dict[str, int] = {}
    for line, row in numbered[1:]:
        if len(row) != len(header):
            raise UserError(f"{path} line {line}: {len(row)} fields; the header has {len(header)}")
        text, value = row[ia].strip(), row[il].strip()
        try:
            canonical = space.to_string(space.from_string(text))
        except UserError as exc:
            raise UserError(f"{path} line {line}: architecture {text!r} is not in space {space.name}: {exc}") from None
        if canonical in seen:
            raise UserError(
                f"{path} line {line}: architecture {text!r} repeats line {seen[canonical]}; "
                f"expected one measurement per architecture (average repeats first)"
            )
        seen[canonical] = line
        if not value:
            raise UserError(f"{path} line {line}: latency_ms is empty; expected a latency in ms > 0")
        try:
            ms = float(value)
        except ValueError:
            raise UserError(f"{path} line {line}: latency_ms {value!r} is not a number; expected ms > 0") from None
        if math.isnan(ms) or math.isinf(ms):
            raise UserError(f"{path} line {line}: latency_ms is {value}; expected a finite latency in ms > 0")
        if ms <= 0:
            raise UserError(f"{path} line {line}: latency_ms is {value}; expected a latency in ms > 0")
        if not MIN_LATENCY_MS <= ms <= MAX_LATENCY_MS:
            raise UserError(f"{path} line {line}: latency_ms is {value}, not a plausible latency "
                            f"of one inference; expected {MIN_LATENCY_MS:g} to {MAX_LATENCY_MS:g} ms")
        archs.append(canonical)
        values.append(ms)
        if i_file is not None:
            files.append(row[i_file].strip())
    if not archs:
        raise UserError(f"measurements file {path} has a header but no rows")
    if len(archs) < min_rows:
        raise UserError(
            f"measurements file {path} has {len(archs)} measurement(s); at least {min_rows} are "
            f"needed"
        )
    return Measurements(archs, np.asarray(values, dtype=np.float64), path, file_sha256(path),
                        tuple(files) if i_file is not None and all(files) else None)


# --------------------------------------------------------------------------------------------
# profiles
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Profile:
    """The ``profile.json`` of a device profile, and where it lives (``path``)."""

    name: str
    space: str
    space_config: dict
    predictor: str
    predictor_class: str
    created: str
    n_measurements: int
    source_csv: str
    source_csv_sha256: str
    hwnas_version: str
    predictor_file: str = PREDICTOR_FILE
    format: str = FORMAT
    path: Path = field(default=Path("."), compare=False)

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("path")
        return d

    @classmethod
    def from_json(cls, d: dict, path: Path) -> Profile:
        known = {f for f in cls.__dataclass_fields__ if f != "path"}
        missing = sorted(known - set(d) - {"predictor_file", "format"})
        if missing:
            raise UserError(f"device profile {path} lacks {', '.join(missing)} in {PROFILE_FILE}")
        return cls(**{k: v for k, v in d.items() if k in known}, path=path)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("hwnas")
    except Exception:  # not installed (running from a checkout)
        return "unknown"


def _class_path(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}:{cls.__qualname__}"


def save_profile(
    name: str,
    space: SearchSpace,
    predictor: Any,
    measurements: Measurements,
    *,
    overwrite: bool = False,
    base: str | Path | None = None,
) -> Profile:
    """Save an adapted predictor and its measurements as the profile ``name``; return it.

    Everything is written into a temporary directory beside the target and renamed into place
    at the end; on any error the temporary directory is removed and nothing is left. An
    existing profile is an error unless ``overwrite``; then it is replaced in one rename.
    """
    check_profile_name(name)
    root = Path(base) if base is not None else profiles_dir()
    target = root / name
    check_profile_target(target, name, overwrite)
    with written.staged(target, WRITER, flag="device profile") as tmp:
        predictor.save(tmp / PREDICTOR_FILE)
        with open(tmp / MEASUREMENTS_FILE, "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["arch", "latency_ms"])
            for arch, ms in zip(measurements.archs, measurements.latency_ms):
                writer.writerow([arch, repr(float(ms))])
        profile = Profile(
            name=name,
            space=space.name,
            space_config=json.loads(json.dumps(space.config())),
            predictor=str(getattr(predictor, "name", type(predictor).__name__)),
            predictor_class=_class_path(predictor),
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            n_measurements=len(measurements),
            source_csv=str(measurements.path.resolve()),
            source_csv_sha256=measurements.sha256,
            hwnas_version=_version(),
            path=target,
        )
        (tmp / PROFILE_FILE).write_text(json.dumps(profile.to_json(), indent=1) + "\n")
    written.replace_dir(tmp, target, writers=[WRITER], what="a device profile",
                        flag="device profile")
    return profile


def check_profile_target(target: Path, name: str, overwrite: bool) -> None:
    """UserError (before any work) unless the profile directory ``target`` is new, or, with
    ``overwrite``, an earlier profile whose record names everything in it
    (:mod:`hwnas.core.written`)."""
    if target.exists() and not overwrite and not target.is_symlink():
        raise UserError(f"device profile {name!r} already exists at {target}; pass --overwrite "
                        f"to replace it")
    written.check_replaceable(target, overwrite=overwrite, writers=[WRITER],
                              what="a device profile", flag="device profile",
                              instead="choose another --device name")
    check_writable(target, "device profile")


def load_profile(name: str, *, base: str | Path | None = None) -> Profile:
    """The profile ``name``; :class:`UserError` if it does not exist or is malformed."""
    profile = find_profile(name, base=base)
    if profile is None:
        root = Path(base) if base is not None else profiles_dir()
        known = [p.name for p in list_profiles(base=base)]
        raise UserError(f"no device profile {name!r} in {root}; profiles: {known or 'none'}")
    return profile


def find_profile(name: str, *, base: str | Path | None = None) -> Profile | None:
    """The profile ``name``, or ``None`` if there is no such directory."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        return None
    root = Path(base) if base is not None else profiles_dir()
    path = root / name
    meta = path / PROFILE_FILE
    if not meta.is_file():
        return None
    try:
        data = json.loads(meta.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"device profile {path} has an unreadable {PROFILE_FILE}: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UserError(f"device profile {path}: {PROFILE_FILE} is not a {FORMAT} file")
    return Profile.from_json(data, path)


def list_profiles(*, base: str | Path | None = None) -> list[Profile]:
    """Every readable profile, by name (unreadable ones are skipped with a warning)."""
    root = Path(base) if base is not None else profiles_dir()
    if not root.is_dir():
        return []
    out = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        try:
            profile = find_profile(entry.name, base=root)
        except UserError as exc:
            warnings.warn(str(exc), stacklevel=2)
            continue
        if profile is not None:
            out.append(profile)
    return out


def load_profile_predictor(profile: Profile) -> Any:
    """The adapted predictor of a profile, loaded with its class's ``load(path)``.

    Only classes of :data:`TRUSTED_PREDICTOR_PACKAGES` are loaded."""
    module_name, _, qualname = profile.predictor_class.partition(":")
    if module_name == "latency" or module_name.startswith("latency."):  # written before hwnas.*
        module_name = "hwnas." + module_name
    trusted = any(module_name == p or module_name.startswith(p + ".")
                  for p in TRUSTED_PREDICTOR_PACKAGES)
    if not trusted or not qualname:
        raise UserError(
            f"device profile {profile.path}: predictor class {profile.predictor_class!r} is not a "
            f"hwnas latency predictor"
        )
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise UserError(
            f"device profile {profile.path}: predictor class {profile.predictor_class!r} cannot be "
            f"imported ({exc}); was it made by another hwnas version ({profile.hwnas_version})?"
        ) from exc
    if not (isinstance(obj, type) and callable(getattr(obj, "load", None))):
        raise UserError(f"device profile {profile.path}: predictor class {profile.predictor_class!r} "
                        f"is not a hwnas latency predictor class")
    file = profile.path / profile.predictor_file
    if not file.exists():
        raise UserError(f"device profile {profile.path} lacks its predictor file {profile.predictor_file}")
    return obj.load(file)
