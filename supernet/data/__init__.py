"""Image datasets for supernet training and evaluation, and the batching that feeds them.

Everything is held in memory as ``uint8`` tensors of shape ``(N, C, H, W)``: the datasets this
toolkit trains on (8x8 digits, 32x32 CIFAR-10, small ImageFolders resized to ``image_size``)
fit easily, and keeping them as raw bytes (4x smaller than float) lets a whole split be moved to
the GPU once, where :func:`augment_batch` and :class:`BatchLoader` then do all per-batch work
without a CPU round trip or worker processes.

The parts: :mod:`.sources` (:func:`load_dataset`: digits, the shared CIFAR-10, a path), the
readers :mod:`.cifar` (cifar10-jpeg ``.npz``, CIFAR-10 pickles) and :mod:`.image_folder`,
:mod:`.splits` (stratified, seeded train/val/test splits and their containers), :mod:`.augment`
and :mod:`.loader`. This package re-exports their public names.
"""

from hwnas.supernet.data.augment import CUTOUT_SIZE, augment_batch
from hwnas.supernet.data.image_folder import IMAGE_EXTENSIONS
from hwnas.supernet.data.loader import BatchLoader
from hwnas.supernet.data.sources import load_dataset
from hwnas.supernet.data.splits import (
    DatasetSplits,
    ImageSplit,
    check_class_names,
    require_every_class,
    subsample_eval,
)
from hwnas.supernet.train_options import AUGMENT_KINDS, check_augment

from hwnas.core.paths import SHARED_DATA_ENV, shared_data_dir

__all__ = [
    "AUGMENT_KINDS",
    "CUTOUT_SIZE",
    "IMAGE_EXTENSIONS",
    "SHARED_DATA_ENV",
    "BatchLoader",
    "DatasetSplits",
    "ImageSplit",
    "augment_batch",
    "check_augment",
    "check_class_names",
    "load_dataset",
    "require_every_class",
    "shared_data_dir",
    "subsample_eval",
]
