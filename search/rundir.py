"""The run directory of a search: the one place that knows its file names and how to read it.

A run directory is what ``hwnas search`` / ``hwnas run`` leave behind and what ``hwnas export``,
:func:`hwnas.load_run` and a continued search read back. :class:`RunDir` names its paths and
reads the tables and the settings (typed: ``SearchConfig``), with one-line errors for a
directory that is not a run. No torch here.
"""

from __future__ import annotations

import json
from pathlib import Path
from collections.abc import Sequence
from typing import Any

from hwnas.core.errors import UserError

__all__ = ["RUN_FORMAT", "RunDir"]

#: config.json's "format": what marks a directory as an hwnas run
RUN_FORMAT = "hwnas-run-1"


class RunDir:
    """Paths and readers of one run directory::

        config.json             the settings (SearchConfig fields plus what the run resolved)
        supernet.pt             the supernet the trials were scored on
        study.db                the Optuna study (SQLite; absent with a server --storage)
        trials.csv / .parquet   one row per completed trial
        pareto_<device>.csv     the Pareto front per device
        hypervolume.csv, fronts.png, devices.png, hypervolume.png, train_history.json,
        accuracy_predictor.json (--accuracy predictor)
        export/                 the exported models and their manifest.json
        finetune/trial_NNNN/    a fine-tuned trial: model.pt, summary.json, its ONNX files
        .hwnas-written.json     the files the search wrote (:mod:`hwnas.core.written`): what
                                marks the directory as a run, and all --overwrite may replace
    """

    CONFIG = "config.json"
    SUPERNET = "supernet.pt"
    STUDY = "study.db"
    TRIALS_CSV = "trials.csv"
    TRIALS_PARQUET = "trials.parquet"
    HYPERVOLUME = "hypervolume.csv"
    TRAIN_HISTORY = "train_history.json"
    PREDICTOR = "accuracy_predictor.json"
    FRONTS_PNG = "fronts.png"
    DEVICES_PNG = "devices.png"
    HYPERVOLUME_PNG = "hypervolume.png"
    EXPORT = "export"
    FINETUNE = "finetune"
    MANIFEST = "manifest.json"
    MANIFEST_CSV = "manifest.csv"
    PARETO_PREFIX, PARETO_SUFFIX = "pareto_", ".csv"
    SPEEDUP_PREFIX = "int8_speedup_"
    #: what writes a run directory, in its record of written files (:mod:`hwnas.core.written`)
    WRITER = "search"
    #: sub-folders other writers own, each with its own record: the export (and the staging
    #: and replaced directories of one in progress or killed), the fine-tunings
    OWNED_ELSEWHERE = ("export", "finetune", ".export.tmp-*", ".export.old-*")

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # -- paths ---------------------------------------------------------------------------
    @property
    def config(self) -> Path:
        return self.path / self.CONFIG

    @property
    def supernet(self) -> Path:
        return self.path / self.SUPERNET

    @property
    def study_db(self) -> Path:
        return self.path / self.STUDY

    @property
    def trials_csv(self) -> Path:
        return self.path / self.TRIALS_CSV

    @property
    def trials_parquet(self) -> Path:
        return self.path / self.TRIALS_PARQUET

    @property
    def hypervolume(self) -> Path:
        return self.path / self.HYPERVOLUME

    @property
    def train_history(self) -> Path:
        return self.path / self.TRAIN_HISTORY

    @property
    def predictor(self) -> Path:
        return self.path / self.PREDICTOR

    @property
    def export_dir(self) -> Path:
        return self.path / self.EXPORT

    def finetune_dir(self, trial: int) -> Path:
        """``finetune/trial_NNNN``: where ``hwnas finetune`` writes trial ``trial``."""
        return self.path / self.FINETUNE / f"trial_{trial:04d}"

    @property
    def manifest(self) -> Path:
        return self.export_dir / self.MANIFEST

    def int8_speedup(self, device: str) -> Path:
        """``export/int8_speedup_<device>.json``: the export's measured int8 speed-up table."""
        return self.export_dir / f"{self.SPEEDUP_PREFIX}{device}.json"

    def int8_speedups(self, devices: Sequence[str]) -> dict[str, dict[str, float]]:
        """The speed-up tables an earlier export of this run measured for ``devices``
        (``{device: {layer shape: float-time / int8-time}}``); a malformed file is a UserError."""
        out = {}
        for device in devices:
            path = self.int8_speedup(device)
            if not path.is_file():
                continue
            try:
                table = json.loads(path.read_text())["int8_speedup"]
                out[device] = {str(k): float(v) for k, v in table.items()}
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                raise UserError(f"{path} is not an int8 speed-up table of hwnas export "
                                f"({type(exc).__name__}: {exc}); delete it or export again") from None
            if not all(0 < v < 1e3 for v in out[device].values()):
                raise UserError(f"{path} holds speed-ups outside (0, 1000); delete it or export "
                                f"again")
        return out

    def pareto(self, device: str) -> Path:
        """``pareto_<device>.csv``."""
        return self.path / f"{self.PARETO_PREFIX}{device}{self.PARETO_SUFFIX}"

    def plot(self, name: str) -> Path:
        return self.path / name

    def fronts(self) -> dict[str, Path]:
        """``{device: pareto_<device>.csv}`` of the fronts written, sorted by device."""
        n, m = len(self.PARETO_PREFIX), len(self.PARETO_SUFFIX)
        return {p.name[n:-m]: p for p in
                sorted(self.path.glob(f"{self.PARETO_PREFIX}*{self.PARETO_SUFFIX}"))}

    def written_files(self, devices: Sequence[str]) -> list[str]:
        """The files a search may write here (recorded before they are written): its
        settings, supernet, study (with SQLite's side files), tables and plots."""
        study = [self.STUDY, *(f"{self.STUDY}{x}" for x in ("-journal", "-wal", "-shm", ".lock"))]
        return [self.CONFIG, self.SUPERNET, self.TRAIN_HISTORY, *study, self.TRIALS_CSV,
                self.TRIALS_PARQUET, self.HYPERVOLUME, self.PREDICTOR, self.FRONTS_PNG,
                self.DEVICES_PNG, self.HYPERVOLUME_PNG, *(self.pareto(d).name for d in devices)]

    def study_url(self) -> str:
        """The default (SQLite) storage URL of the run's study."""
        return f"sqlite:///{self.study_db.resolve()}"

    # -- reading -------------------------------------------------------------------------
    def is_run(self) -> bool:
        """Whether the directory holds a run hwnas wrote: its record of written files
        (:mod:`hwnas.core.written`) is a search's and names config.json, which carries
        :data:`RUN_FORMAT`. A config.json alone is not enough (users copy them)."""
        from hwnas.core.written import read_record

        record = read_record(self.path)
        if record is None or record["writer"] != self.WRITER or self.CONFIG not in record["files"]:
            return False
        if self.config.is_symlink():
            return False
        try:
            saved = json.loads(self.config.read_text())
        except (OSError, ValueError):
            return False
        if not isinstance(saved, dict):
            return False
        return saved.get("format") == RUN_FORMAT

    def read_config(self, *, need_supernet: bool = True) -> dict[str, Any]:
        """config.json as a dict; UserError (one line) when the directory is missing, not a
        run (no config.json with "space" and "dataset"), or lacks its supernet."""
        run_dir = self.path
        if not run_dir.exists():
            raise UserError(f"run directory {run_dir} does not exist; expected a directory "
                            f"written by 'hwnas search' or 'hwnas run'")
        if not run_dir.is_dir():
            raise UserError(f"{run_dir} is not a directory; expected an hwnas run directory")
        if not self.config.is_file():
            raise UserError(f"{run_dir} is not an hwnas run directory (no {self.CONFIG})")
        try:
            cfg = json.loads(self.config.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"{self.config} is not valid JSON: {exc}") from None
        if not isinstance(cfg, dict) or not {"space", "dataset"} <= set(cfg):
            raise UserError(f"{self.config} is not an hwnas run configuration (needs \"space\" "
                            f"and \"dataset\")")
        if need_supernet and self.supernet.is_symlink():
            raise UserError(f"{self.supernet} is a symbolic link (to {self.supernet.resolve()}), "
                            f"not the supernet checkpoint the search wrote; restore the run's "
                            f"own file")
        if need_supernet and not self.supernet.is_file():
            raise UserError(f"{run_dir} has no {self.SUPERNET}; the run's supernet is needed to "
                            f"rebuild its models")
        return cfg

    def read_search_config(self, *, need_supernet: bool = True):  # -> SearchConfig
        """config.json as the typed :class:`hwnas.search.config.SearchConfig` the search ran
        with (its devices the reported ones; ``all_devices`` the run's full list), after the
        checks of :meth:`read_config`; UserError (one line) for a setting of the wrong type or
        one this version does not know."""
        from hwnas.search.config import SearchConfig

        return SearchConfig.from_dict(self.read_config(need_supernet=need_supernet),
                                      source=str(self.config))

    def read_trials(self):  # -> pd.DataFrame
        """trials.parquet (or trials.csv) as a DataFrame, policies as text ("" = float)."""
        import pandas as pd

        if self.trials_parquet.is_file():
            frame = _read_table(self.trials_parquet, pd.read_parquet)
        elif self.trials_csv.is_file():
            frame = _read_table(self.trials_csv, pd.read_csv)
        else:
            raise UserError(f"{self.path} has no {self.TRIALS_CSV}; has its search finished?")
        if not {"trial", "arch"} <= set(frame.columns):
            raise UserError(f"{self.path}: its trials table lacks the columns trial and arch; "
                            f"it is not a table hwnas wrote (search again, or restore it)")
        if "policy" in frame:
            frame["policy"] = frame["policy"].fillna("").astype(str)
        return frame

    def read_fronts(self) -> dict:  # -> dict[str, pd.DataFrame]
        """``{device: its Pareto front}`` from the pareto_<device>.csv files."""
        import pandas as pd

        out = {}
        for device, path in self.fronts().items():
            frame = _read_table(path, pd.read_csv)
            if "policy" in frame:
                frame["policy"] = frame["policy"].fillna("").astype(str)
            out[device] = frame
        return out


def _read_table(path: Path, read):  # -> pd.DataFrame
    """``read(path)`` (a pandas reader); UserError (one line) for a file it cannot read: a
    corrupt parquet file, a CSV that is not UTF-8 or not a table."""
    from hwnas.core.io import first_line

    try:
        return read(path)
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - pandas and pyarrow raise many types for bad files
        raise UserError(f"cannot read {path}: {type(exc).__name__}: {first_line(exc)}; it is "
                        f"not a table hwnas wrote (search again, or restore it)") from None
