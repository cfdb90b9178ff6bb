"""The settings of a search (``hwnas search``, ``hwnas run``, :func:`search.run`), validated
before anything is written. The CLI maps its flags one to one onto these fields, so the API and
the CLI share one set of defaults. No torch here.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from hwnas.search.bits import DEFAULT_BIT_CHOICES, check_bit_choices
from hwnas.search.objectives import (
    Constraint,
    Metric,
    devices_of,
    parse_constraints,
    parse_objectives,
)
from hwnas.search.samplers import DEFAULT_SAMPLER, SAMPLERS, check_screening_objectives
from hwnas.supernet.train_options import MAX_EPOCHS, check_augment

from hwnas.core.errors import UserError

#: objectives of a default search: accuracy, latency on this CPU, model size
DEFAULT_OBJECTIVES = "accuracy,latency:cpu-ort-1t,size"
#: the most trials one search may ask for: a typo (1 followed by 29 zeros) fails at once
#: instead of running until killed; a real search needs hundreds to a few thousand
MAX_TRIALS = 1_000_000
#: devices every default search reports (a front per device), besides those of the objectives
DEFAULT_DEVICES = ("cpu-ort-1t", "edgetpu-est", "fpga-zcu102-est", "jetson-orin-nano-est")

#: settings that must match when a run directory is continued (the budget may grow)
RESUME_KEYS = ("space", "dataset", "data_seed", "supernet", "epochs", "objectives",
               "constraints", "devices", "bits", "bit_choices", "sampler", "seed", "study_name",
               "calib_batches", "ptq_images", "eval_images", "accuracy", "predictor_samples", "augment")
#: keys a run's config.json adds to the fields (what the run resolved); :meth:`SearchConfig.from_dict`
#: reads past them, taking the devices the user asked for from ``reported_devices``
#: (``requested_space``: the --space of a run that went on in a variant's space, ``space``)
RUN_ONLY_KEYS = ("format", "reported_devices", "dataset_name", "requested_space")
#: where the accuracy objective comes from
ACCURACY_SOURCES = ("supernet", "predictor")


def check_mlflow(uri: str) -> None:
    """A UserError, before anything runs, when ``--mlflow`` cannot work: an empty URI, or the
    ``mlflow`` extra (optuna-integration and MLflow) not installed."""
    import importlib.util

    if not isinstance(uri, str) or not uri.strip():
        raise UserError(f"--mlflow {uri!r}: expected an MLflow tracking URI, e.g. file:./mlruns")
    missing = [m for m in ("mlflow", "optuna_integration")
               if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"--mlflow needs {' and '.join(missing)}: pip install 'hwnas[mlflow]'")


@dataclass
class SearchConfig:
    """Everything a search needs; see ``hwnas search --help`` for each field."""

    space: str = "mbv3-tiny"
    dataset: str = "digits"
    supernet: str | None = None
    epochs: int = 30
    objectives: str = DEFAULT_OBJECTIVES
    constraints: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=lambda: list(DEFAULT_DEVICES))
    bits: bool = True
    bit_choices: list[int] = field(default_factory=lambda: list(DEFAULT_BIT_CHOICES))
    #: a name of :data:`SAMPLERS`, or an Optuna sampler object (``optuna.samplers.NSGAIISampler(...)``,
    #: used as given; the run records its class name)
    sampler: Any = DEFAULT_SAMPLER
    trials: int = 60
    seed: int = 0
    data_seed: int = 0
    storage: str | None = None
    study_name: str | None = None
    workers: int = 1
    name: str | None = None
    out: str = "runs"
    torch_device: str = "cpu"
    calib_batches: int = 10
    ptq_images: int = 256
    #: validation images scoring each candidate and test images scoring each front model, at
    #: most (a stratified seeded subset; 0: the whole splits): a CPU budget for large datasets
    eval_images: int = 0
    sensitivity_seeds: bool = True
    accuracy: str = "supernet"
    predictor_samples: int = 60
    #: training augmentation of a supernet trained for the run (None: the dataset's); a
    #: checkpoint recorded with another is refused
    augment: str | None = None
    #: an MLflow tracking URI (``file:./mlruns``, ``http://host:5000``): every completed trial is
    #: logged as an MLflow run by Optuna's own ``MLflowCallback`` (the ``mlflow`` extra)
    mlflow: str | None = None

    # -- parsed views --------------------------------------------------------------------
    @property
    def objective_metrics(self) -> list[Metric]:
        return parse_objectives(self.objectives)

    @property
    def constraint_list(self) -> list[Constraint]:
        return parse_constraints(self.constraints)

    @property
    def all_devices(self) -> list[str]:
        """Devices of the objectives and constraints first, then the reported ones."""
        named = devices_of(self.objective_metrics, self.constraint_list)
        return named + [d for d in self.devices if d not in named]

    def validate(self) -> None:
        """Raise UserError on the first bad setting (no I/O except the device registry)."""
        from hwnas.supernet.spaces import available_spaces

        if self.space not in available_spaces():
            raise UserError(f"unknown space {self.space!r}; expected one of {available_spaces()}")
        for key in ("seed", "data_seed"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2 ** 32:
                flag = "--seed" if key == "seed" else "data_seed"
                raise UserError(f"{flag} must be an integer from 0 to {2 ** 32 - 1} (expected a "
                                f"seed from 0), got {value!r}")
        if self.supernet is None and self.epochs > MAX_EPOCHS:
            raise UserError(f"--epochs {self.epochs}: at most {MAX_EPOCHS}")
        if isinstance(self.trials, bool) or not isinstance(self.trials, int) or self.trials <= 0:
            raise UserError(f"--trials must be a positive number of trials, got {self.trials!r}")
        if self.trials > MAX_TRIALS:
            raise UserError(f"--trials {self.trials}: at most {MAX_TRIALS}")
        if self.supernet is None and self.epochs <= 0:
            raise UserError(f"--epochs must be positive, got {self.epochs}")
        if not isinstance(self.sampler, str):
            if not callable(getattr(self.sampler, "sample_independent", None)):
                raise UserError(f"sampler {self.sampler!r}: expected one of {list(SAMPLERS)} or an "
                                f"Optuna sampler object (optuna.samplers.BaseSampler)")
            if self.workers > 1:
                raise UserError(f"--workers {self.workers} with a sampler object: each worker "
                                f"process builds its own sampler from a name; pass a name, or "
                                f"start the workers yourself on the same --storage")
        elif self.sampler not in SAMPLERS:
            raise UserError(f"unknown sampler {self.sampler!r}; expected one of {list(SAMPLERS)}")
        if self.workers <= 0:
            raise UserError(f"--workers must be positive, got {self.workers}")
        if self.mlflow is not None:
            check_mlflow(self.mlflow)
        if self.workers > 1 and (self.storage is None or self.storage.startswith("sqlite")):
            raise UserError(f"--workers {self.workers} needs a server database: SQLite cannot be "
                            f"shared by several writers; pass --storage postgresql://USER@HOST/DB "
                            f"(or mysql://...), or run one worker")
        if self.storage is not None and "://" not in self.storage:
            raise UserError(f"--storage {self.storage!r} is not a database URL; expected e.g. "
                            f"sqlite:///path/study.db or postgresql://user@host:5432/db")
        if self.name is not None and (not self.name or "/" in self.name or self.name.startswith(".")):
            raise UserError(f"--name {self.name!r} must be a plain directory name")
        if self.accuracy not in ACCURACY_SOURCES:
            raise UserError(f"--accuracy {self.accuracy!r}: expected one of {list(ACCURACY_SOURCES)}")
        if self.accuracy == "predictor" and self.predictor_samples < 8:
            raise UserError(f"--predictor-samples must be at least 8, got {self.predictor_samples}")
        if self.augment is not None:
            check_augment(self.augment)
        if self.calib_batches <= 0 or self.ptq_images <= 0:
            raise UserError("calib_batches and ptq_images must be positive")
        if isinstance(self.eval_images, bool) or not isinstance(self.eval_images, int) \
                or self.eval_images < 0:
            raise UserError(f"--eval-images must be a non-negative number of images (0: every "
                            f"image), got {self.eval_images!r}")
        if not self.bits and list(self.bit_choices) != list(DEFAULT_BIT_CHOICES):
            raise UserError(f"--no-bits searches float models only, but --bit-choices "
                            f"{','.join(map(str, self.bit_choices))} asks for bit-widths; "
                            f"leave out one of the two")
        self.bit_choices = list(check_bit_choices(self.bit_choices))
        self.constraints = [c.text for c in self.constraint_list]  # one spelling each
        if not self.all_devices:  # parses objectives and constraints: their errors surface here
            raise UserError("no device: name one in an objective (latency:DEVICE) or --devices")
        if self.sampler == "screening":
            check_screening_objectives(self.objective_metrics)

    @property
    def sampler_name(self) -> str:
        """The sampler's name, or a sampler object's class name (what the run records)."""
        return self.sampler if isinstance(self.sampler, str) else type(self.sampler).__name__

    def to_dict(self) -> dict[str, Any]:
        sampler, self.sampler = self.sampler, self.sampler_name  # asdict would deep-copy an object
        try:
            return asdict(self)
        finally:
            self.sampler = sampler

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, source: str = "config") -> SearchConfig:
        """The settings of a dict: the fields by name (a TOML file, the API), or a run's
        config.json (its devices are the reported ones, its resolved extras are skipped).
        UserError (one line, naming ``source``) for an unknown key or a value of the wrong
        type; the values themselves are checked by :meth:`validate`."""
        if not isinstance(values, dict):
            raise UserError(f"{source}: expected a table of settings, got {type(values).__name__}")
        values = dict(values)
        if "reported_devices" in values:  # a run's config.json: devices = all its devices
            values["devices"] = values["reported_devices"]
        for key in RUN_ONLY_KEYS:
            values.pop(key, None)
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise UserError(f"{source}: unknown setting(s) {', '.join(unknown)}; expected some "
                            f"of {', '.join(known)}")
        for key, value in values.items():
            f = known[key]
            default = f.default if f.default is not MISSING else f.default_factory()
            _check_type(source, key, value, default)
        return cls(**values)


def _check_type(source: str, key: str, value: Any, default: Any) -> None:
    """UserError unless ``value`` has the type the field's default has (None where the
    default is None: a string, or None)."""
    if default is None:
        ok = value is None or isinstance(value, str)
        want = "a string"
    elif isinstance(default, bool):
        ok, want = isinstance(value, bool), "true or false"
    elif isinstance(default, int):
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif isinstance(default, str):
        ok, want = isinstance(value, str), "a string"
    else:  # lists: of the default's item type
        item = type(default[0]) if default else str
        ok = isinstance(value, list) and all(isinstance(v, item) and not isinstance(v, bool)
                                             for v in value)
        want = f"a list of {'integers' if item is int else 'strings'}"
    if not ok:
        raise UserError(f"{source}: {key} = {value!r}: expected {want}")
