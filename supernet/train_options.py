"""Training options that are checked before anything heavy is imported (no torch here): the
augmentation names and their check, and the bound on epochs."""

from __future__ import annotations

from hwnas.core.errors import UserError

__all__ = ["AUGMENT_KINDS", "MAX_EPOCHS", "check_augment"]

#: More epochs than any real run needs: a typo such as 1e30 fails at once instead of growing a
#: per-epoch history without end.
MAX_EPOCHS = 100_000

#: The augmentation kinds :func:`hwnas.supernet.data.augment_batch` knows.
AUGMENT_KINDS: tuple[str, ...] = (
    "shift", "crop_flip", "crop_flip_cutout", "trivial_crop_flip_cutout", "none")

def check_augment(kind: str, channels: int | None = None) -> None:
    """:class:`UserError` unless ``kind`` is an augmentation of :data:`AUGMENT_KINDS` that
    applies to images of ``channels`` channels (TrivialAugment's colour operations need RGB;
    ``None``: the channels are not known yet, only the name is checked)."""
    if kind not in AUGMENT_KINDS:
        raise UserError(f"unknown augmentation {kind!r}; expected one of {', '.join(AUGMENT_KINDS)}")
    if kind.startswith("trivial_") and channels is not None and channels != 3:
        raise UserError(f"augmentation {kind!r} needs RGB images; this split has {channels} "
                        f"channel(s) (use crop_flip_cutout)")
