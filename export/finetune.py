"""Specialise a chosen model: fine-tune one trial of a run, save it, export it again.

Once-for-All's second half: after the search picks a subnet, a few epochs of training as a
standalone network recover what weight sharing cost it. ``hwnas finetune RUN --trial N`` and
``hwnas.load_run(RUN).finetune(N)`` call :func:`finetune_trial`: the trial rebuilt as the search
scored it, fine-tuned by distillation (LSQ QAT under a bit policy), written to
``RUN/finetune/trial_NNNN/`` (:func:`save_finetuned`, :func:`load_finetuned`) and exported again
with the export's verification.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hwnas.core.errors import UserError
from hwnas.core import written
from hwnas.core.io import check_writable, first_line, write_atomic, write_json

__all__ = ["FINETUNE_FORMAT", "FinetuneResult", "FinetuneSettings", "finetune_trial",
           "load_finetuned", "save_finetuned"]

#: the format tag of model.pt and summary.json
FINETUNE_FORMAT = "hwnas-finetuned-1"
CHECKPOINT, SUMMARY = "model.pt", "summary.json"
#: what writes a fine-tuning directory, in its record of written files (:mod:`hwnas.core.written`)
WRITER = "finetune"


#: the fine-tuning learning rate of the spaces that name none (tuned on mbv3: see quant/qat.py)
DEFAULT_LR = 3e-3


@dataclass
class FinetuneSettings:
    """How a trial is fine-tuned. The loss is ``kd_weight * T^2 * softCE(student, teacher / T)
    + label_weight * CE(student, labels)`` with ``T = temperature``; ``lr`` is the peak of a
    cosine schedule after ``warmup_frac`` of the steps (SGD, Nesterov momentum 0.9), also for
    the LSQ step sizes under QAT; None = the space's (:meth:`for_space`:
    ``SearchSpace.finetune_defaults``, else :data:`DEFAULT_LR`). ``seed``: None = the run's.
    ``max_test_images``: test images of the export's parity checks."""

    epochs: int = 3
    lr: float | None = None
    batch_size: int = 128
    temperature: float = 2.0
    kd_weight: float = 1.0
    label_weight: float = 1.0
    weight_decay: float = 0.0
    warmup_frac: float = 0.1
    device: str = "cpu"
    seed: int | None = None
    max_test_images: int = 1000

    def validate(self) -> None:
        for name in ("epochs", "batch_size", "max_test_images"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"fine-tuning setting {name} must be a positive integer, got "
                                f"{value!r}")
        if self.epochs > 1000:
            raise UserError(f"fine-tuning asks for {self.epochs} epochs; at most 1000")
        for name in ("lr", "temperature"):
            value = getattr(self, name)
            if name == "lr" and value is None:  # the space's, filled in by for_space
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
                    or value == float("inf"):
                raise UserError(f"fine-tuning setting {name} must be a positive number, got "
                                f"{value!r}")
        if not (self.kd_weight >= 0 and self.label_weight >= 0
                and self.kd_weight + self.label_weight > 0):
            raise UserError(f"kd_weight and label_weight must be >= 0 and not both 0, got "
                            f"{self.kd_weight} and {self.label_weight}")
        if not self.weight_decay >= 0:
            raise UserError(f"weight_decay must be >= 0, got {self.weight_decay}")

    def for_space(self, space: Any) -> "FinetuneSettings":
        """These settings with what was left to the space (``None``) filled in from
        ``space.finetune_defaults()``, else the toolkit's defaults."""
        own = space.finetune_defaults()
        lr = self.lr if self.lr is not None else own.get("lr", DEFAULT_LR)
        return replace(self, lr=lr)

    def qat_config(self, seed: int, *, amp: bool):  # -> QATConfig
        from hwnas.quant.qat import QATConfig

        if self.lr is None:
            raise UserError("fine-tuning settings without lr: call for_space(space) first")

        config = QATConfig(epochs=self.epochs, lr=self.lr, scale_lr=self.lr,
                           warmup_frac=self.warmup_frac, weight_decay=self.weight_decay,
                           temperature=self.temperature, kd_weight=self.kd_weight,
                           label_weight=self.label_weight, amp=amp, seed=seed)
        config.validate()
        return config


@dataclass
class FinetuneResult:
    """What :func:`finetune_trial` did: accuracies (%) ``before`` and ``after`` per split
    (``val``, ``test``), the per-epoch ``history`` (``val`` each epoch, epoch 0 the start),
    the epoch kept, training seconds, and the export's record (``export.status`` ok/failed)."""

    out_dir: Path
    trial: int
    arch: str
    policy: dict | None
    teacher: str
    before: dict[str, float]
    after: dict[str, float]
    epochs: int
    kept_epoch: int
    seconds: float
    device: str
    history: list[dict[str, float]] = field(default_factory=list)
    export: Any = None

    @property
    def checkpoint(self) -> Path:
        return self.out_dir / CHECKPOINT

    def summary(self) -> dict[str, Any]:
        """summary.json's content."""
        export = self.export
        return {"format": FINETUNE_FORMAT, "trial": self.trial, "arch": self.arch,
                "policy": self.policy, "teacher": self.teacher, "before": self.before,
                "after": self.after, "epochs": self.epochs, "kept_epoch": self.kept_epoch,
                "seconds": round(self.seconds, 3), "device": self.device,
                "history": self.history, "checkpoint": CHECKPOINT,
                "export": None if export is None else {
                    "status": export.status, "errors": export.errors,
                    "files": [{k: v for k, v in asdict(f).items()
                               if k in ("path", "precision", "status", "error", "top1_agreement",
                                        "max_abs_diff", "test_accuracy", "reference")}
                              for f in export.files]}}


# -- the checkpoint -----------------------------------------------------------------------------

def save_finetuned(path: str | Path, model: Any, space: Any, arch: Any, policy: Any, *,
                   dataset: str, metadata: dict[str, Any]) -> Path:
    """Write a fine-tuned standalone model (float, or fake-quantized under ``policy``)
    atomically: tensors and plain data only (format, space and its configuration, arch,
    policy, dataset, ``metadata`` as JSON text, the state dict)."""
    import torch

    payload = {"format": FINETUNE_FORMAT, "space": space.name, "space_config": space.config(),
               "arch": space.to_string(arch), "policy": None if policy is None else policy.to_dict(),
               "dataset": dataset, "metadata": json.dumps(metadata, default=str),
               "state_dict": {k: v.detach().cpu().contiguous()
                              for k, v in model.state_dict().items()}}
    return write_atomic(path, lambda tmp: torch.save(payload, tmp))


def load_finetuned(path: str | Path, *, device: str = "cpu") -> tuple[Any, dict[str, Any]]:
    """``(model in eval mode, payload)`` of a :func:`save_finetuned` file. Read with
    ``torch.load(weights_only=True)``: a file holding anything but tensors and plain data is
    refused, never executed. A model with a policy comes back fake-quantized under it."""
    import pickle

    import torch
    from hwnas.quant.policy import QuantPolicy
    from hwnas.quant.ptq import quantize_model
    from hwnas.supernet.spaces import get_space

    path = Path(path)
    if not path.is_file():
        raise UserError(f"fine-tuned checkpoint {path} does not exist; expected a {CHECKPOINT} "
                        f"written by 'hwnas finetune'")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise UserError(f"cannot read {path}: it holds objects other than tensors and plain data, "
                        f"which hwnas never loads (they could run code)") from None
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a corrupt file
        raise UserError(f"cannot read {path}: {first_line(exc)}") from None
    if not isinstance(payload, dict) or payload.get("format") != FINETUNE_FORMAT:
        raise UserError(f"{path} is not a fine-tuned model of hwnas (no {FINETUNE_FORMAT!r} tag)")
    try:
        space = get_space(payload["space"], config=payload["space_config"])
        arch = space.from_string(payload["arch"])
        model = space.build_supernet().extract(arch)
        if payload.get("policy") is not None:
            policy = QuantPolicy.from_dict(payload["policy"], source=f"policy of {path}")
            model = quantize_model(model, policy)
        model.load_state_dict(payload["state_dict"])
    except UserError as exc:
        raise UserError(f"{path}: {exc}") from None
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise UserError(f"{path} does not hold a model hwnas can rebuild: {first_line(exc)}") from None
    return model.to(device).eval(), payload


# -- the output directory -------------------------------------------------------------------------

def _check_replaceable(out_dir: Path, run_dir: Path, overwrite: bool) -> None:
    """Raise unless ``out_dir`` is new or empty, or (with ``overwrite``) an earlier fine-tuning
    output whose record names everything in it (:mod:`hwnas.core.written`)."""
    if out_dir.exists() and not out_dir.is_symlink() and any(out_dir.iterdir()):
        target, run = out_dir.resolve(), run_dir.resolve()
        if target == run or target in run.parents:
            raise UserError(f"--out {out_dir} is the run directory or holds it; choose a new "
                            f"directory")
    written.check_replaceable(out_dir, overwrite=overwrite, writers=[WRITER],
                              what="a fine-tuned model", instead="choose another --out")
    check_writable(out_dir)


# -- fine-tuning ----------------------------------------------------------------------------------

def finetune_trial(run: Any, trial: int, *, settings: FinetuneSettings | None = None,
                   out: str | Path | None = None, overwrite: bool = False,
                   export_settings: Any = None, progress: bool = True,
                   devices: Sequence[str] | None = None) -> FinetuneResult:
    """Fine-tune trial ``trial`` of ``run`` (a run directory, or a
    :class:`hwnas.search.replay.RunReplay` such as :class:`hwnas.Run`), write it to ``out`` (default
    ``RUN/finetune/trial_NNNN``) and export it:

    1. rebuild trial ``N`` exactly as the search scored it (:class:`hwnas.search.replay.RunReplay`:
       the subnet extracted from the run's supernet, BatchNorm recalibrated; PTQ under its
       policy), on the run's splits (validation and test disjoint from the supernet's training
       images);
    2. fine-tune the extracted standalone module on the training split by knowledge distillation
       from the supernet's largest subnet (soft targets at a temperature, plus the label loss;
       SGD with warm-up and cosine decay: :func:`hwnas.quant.qat.distill`); a trial with a bit
       policy is fine-tuned with LSQ quantization-aware training under that policy
       (:func:`hwnas.quant.qat.qat`, starting from the searched PTQ model). Validation accuracy
       is scored each epoch and the best state kept (never worse than the start on validation);
    3. write ``model.pt`` (:func:`save_finetuned`: weights, arch, policy and the summary as plain
       data, read back with ``torch.load(weights_only=True)`` by :func:`load_finetuned`),
       ``summary.json`` (validation and test accuracy before and after, epochs, seconds, device)
       and the model's ONNX files through :func:`hwnas.export.model_export.export_model`: FP32
       and, with a policy, the QDQ files, verified as the export verifies them. The QDQ files
       take the LSQ-learned weight and activation scales of the QAT model as they are
       (``export_model(quantized=...)``; no PTQ calibration re-runs), and their top-1 agreement
       is checked against that QAT model. The FP32 file of a quantized trial is its float twin
       (the QAT weights, quantizers removed).

    Everything is written into a staging directory beside the output and moved into place at
    the end; an output directory that ``hwnas finetune`` did not write is never replaced, and
    one it wrote only with ``overwrite``. On CUDA the float fine-tuning runs under bf16
    autocast; QAT runs in float32 (why: ``benchmarks/finetune_cifar10.md``). ``devices``: the
    devices measurable here to time the exported files on and recommend one for (default: the
    run's, as ``hwnas export`` does; ``()``: verify only). Bad input (no such
    run or trial, a trial whose model cannot be rebuilt, an output directory that cannot be
    replaced, bad settings, a device this machine lacks) raises UserError before anything is
    written."""
    from hwnas.export.model_export import ExportSettings
    from hwnas.search.replay import RunReplay
    from hwnas.supernet.train import check_torch_device

    settings = settings or FinetuneSettings()
    settings.validate()
    export_settings = export_settings or ExportSettings()
    export_settings.validate()
    run = run if isinstance(run, RunReplay) else RunReplay(run)
    device = check_torch_device(settings.device)
    arch, policy = run.candidate(trial)  # UserError: no such trial, an arch outside the space
    trial = int(trial)
    out_dir = Path(out) if out is not None else run.dir.finetune_dir(trial)
    _check_replaceable(out_dir, run.path, overwrite)
    tunable = _tunable_devices(run, devices)
    settings = settings.for_space(run.space)
    seed = run.config.seed if settings.seed is None else int(settings.seed)
    result, final = _tune(run, trial, arch, policy, settings, seed, device, out_dir, progress)
    _write(run, result, final, arch, policy, settings, seed, tunable, export_settings, progress)
    return result


def _tunable_devices(run: Any, devices: Sequence[str] | None) -> dict[str, Any]:
    """The devices to time the exported files on (default the run's measurable ones);
    UserError for one asked for that this CPU cannot measure."""
    from hwnas.export.model_export import measurable_devices

    tunable = measurable_devices(str(d) for d in (run.config.all_devices
                                                  if devices is None else devices))
    wrong = [d for d in devices or () if d not in tunable]
    if wrong:
        raise UserError(f"device {wrong[0]!r} cannot be measured on this CPU; expected "
                        f"cpu-ort-<N>t or cpu-ov-<N>t (OpenVINO installed), optionally with "
                        f"-b<batch>")
    return tunable


def _tune(run: Any, trial: int, arch: Any, policy: Any, settings: FinetuneSettings, seed: int,
          device: Any, out_dir: Path, progress: bool) -> tuple[FinetuneResult, Any]:
    """(result without its export, the tuned model in eval mode): the trial rebuilt as the
    search scored it, distilled from the largest subnet (QAT under its policy), scored on
    validation and test before and after."""
    import torch
    from hwnas.quant.qat import distill, qat
    from hwnas.supernet.data import BatchLoader
    from hwnas.supernet.evaluate import accuracy, eval_loader

    space, supernet = run.space, run.supernet
    supernet.to(device)
    evaluator = run.evaluator
    data = run.data

    def batches(split: Any) -> BatchLoader:
        return eval_loader(data, split, batch_size=max(256, settings.batch_size), device=device)
    val, test = batches(data.val), batches(data.test)
    torch.manual_seed(seed)
    model = evaluator.float_model(arch)
    teacher = evaluator.float_model(space.largest())
    start_model = model if policy is None else evaluator.quantized_model(model, policy)
    before = {"val": accuracy(start_model, val), "test": accuracy(start_model, test)}
    train = BatchLoader(data.train, batch_size=settings.batch_size, mean=data.mean, std=data.std,
                        shuffle=True, augment=data.augment, seed=seed, device=device,
                        drop_last=len(data.train) > settings.batch_size)
    start = time.perf_counter()
    if policy is None:
        config = settings.qat_config(seed, amp=device.type == "cuda")
        tuned = distill(model, teacher, train, config, progress=progress, val_batches=val,
                        desc=f"fine-tune trial {trial}")
    else:
        config = settings.qat_config(seed, amp=False)
        calib = evaluator.calibration_batches(device)
        tuned = qat(model, policy, train, calib, config, init=start_model, teacher=teacher,
                    progress=progress, val_batches=val)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    final = tuned.model.eval()
    after = {"val": accuracy(final, val), "test": accuracy(final, test)}
    result = FinetuneResult(out_dir, trial, space.to_string(arch),
                            None if policy is None else policy.to_dict(),
                            space.to_string(space.largest()), before, after, settings.epochs,
                            tuned.kept_epoch, seconds, str(device), tuned.history)
    return result, final


def _write(run: Any, result: FinetuneResult, final: Any, arch: Any, policy: Any,
           settings: FinetuneSettings, seed: int, tunable: dict[str, Any], export_settings: Any,
           progress: bool) -> None:
    """Export the tuned model and write model.pt and summary.json into ``result.out_dir``,
    staged and moved into place whole; ``result.export`` is the export's record."""
    from hwnas.export.model_export import export_model
    from hwnas.export.onnx_export import InputSpec
    from hwnas.export.qdq import dequantized_twin
    from hwnas.supernet.data import BatchLoader

    data, space, trial, out_dir = run.data, run.space, result.trial, result.out_dir
    test_images, test_labels = next(iter(BatchLoader(
        data.test, batch_size=settings.max_test_images, mean=data.mean, std=data.std,
        shuffle=True, seed=seed)))
    final = final.cpu()
    written.remove_stale(out_dir)
    with written.staged(out_dir, WRITER) as staging:
        result.export = export_model(
            final if policy is None else dequantized_twin(final), name=f"trial_{trial:04d}",
            out_dir=staging, example=test_images[:1], test_images=test_images,
            test_labels=test_labels, policy=policy, quantized=None if policy is None else final,
            calibration=None if policy is None else run.evaluator.calibration_batches("cpu"),
            arch=result.arch, accuracy=result.after["val"], devices=tunable,
            settings=export_settings, progress=progress,
            input_spec=InputSpec(tuple(data.mean), tuple(data.std), tuple(data.classes)),
            metadata={"trial": trial, "space": space.name, "dataset": run.config.dataset,
                      "test_accuracy": result.after["test"],
                      "finetuned": {"epochs": settings.epochs, "teacher": result.teacher,
                                    "before": result.before, "after": result.after}})
        save_finetuned(staging / CHECKPOINT, final, space, arch, policy,
                       dataset=str(run.config.dataset), metadata=result.summary())
        summary = result.summary()
        summary["settings"] = asdict(settings)
        summary["run_dir"] = str(run.path)
        write_json(staging / SUMMARY, summary)
    written.replace_dir(staging, out_dir, writers=[WRITER], what="a fine-tuned model")
