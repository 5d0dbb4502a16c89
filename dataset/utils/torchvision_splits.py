"""Datasets that torchvision downloads: every split into ``rawdata/``, nothing left of a failed download.

:func:`torchvision_loader` and :func:`load_torchvision` suit a dataset stored as torchvision gives it
(``data``, ``targets``, already the stored size). Omniglot (background and evaluation sets, PIL images)
and Digit5's domains (SVHN's ``split`` and channel-first ``data``; every domain resized) do not fit
them, so such a generator says how to open one split (:data:`SplitOpener`) and :func:`download_splits`
does the rest: download into ``rawdata/``, remove what a failed download wrote, and turn the failure
into one line that says how to build offline.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from dataset.utils.one_line import error_reason
from dataset.utils.raw_data import (SOURCE_HINT, DownloadError, RawLoader, images_to_float, load_source_npz,
                                    removed_on_failure)

# (download folder, which split) -> (uint8 images, labels) of that split; downloads when needed.
SplitOpener = Callable[[str, bool], Tuple[np.ndarray, np.ndarray]]


def download_splits(name: str, open_split: SplitOpener, raw_dir: Path, hint: str,
                    splits: Sequence[bool] = (True, False)) -> List[Tuple[np.ndarray, np.ndarray]]:
    """``open_split(raw_dir, split)`` for each of ``splits``, downloading into ``raw_dir``.

    On failure what the download created is removed; a network or checksum error (torchvision raises
    ``OSError`` or ``RuntimeError``) becomes :class:`DownloadError` naming ``name`` and ending in ``hint``.
    """
    raw_dir = Path(raw_dir)
    try:
        with removed_on_failure(raw_dir):
            return [open_split(str(raw_dir), split) for split in splits]
    except (OSError, RuntimeError) as err:
        reason = error_reason(err)
        raise DownloadError(f"could not download {name} ({reason}); {hint}") from None


def pooled(parts: Sequence[Tuple[np.ndarray, np.ndarray]]) -> Tuple[np.ndarray, np.ndarray]:
    """The splits as one dataset: every client's data is re-split 75/25 after partitioning anyway."""
    return (np.concatenate([np.asarray(x) for x, _ in parts]),
            np.concatenate([np.asarray(y) for _, y in parts]).astype(np.int64))


def torchvision_loader(class_name: str, **kwargs) -> RawLoader:
    """A :data:`RawLoader` for ``torchvision.datasets.<class_name>``: ``--source`` file, else download."""
    def load(source: Optional[Path], raw_dir: Path) -> Tuple[np.ndarray, np.ndarray]:
        if source is not None:
            return load_source_npz(source)
        import torchvision.datasets
        return load_torchvision(getattr(torchvision.datasets, class_name), raw_dir, **kwargs)
    return load


def load_torchvision(dataset_cls, raw_dir: Path, **kwargs) -> Tuple[np.ndarray, np.ndarray]:
    """Download a torchvision dataset into ``raw_dir`` and merge its train and test splits, as floats.

    The split is merged because every client's data is re-split 75/25 after partitioning. When the
    download fails, whatever it created under ``raw_dir`` (and ``raw_dir`` itself, and any parent
    folder it had to make) is removed, and :class:`DownloadError` says how to build the data offline.
    """
    def open_split(root: str, train: bool) -> tuple:
        split = dataset_cls(root, train=train, download=True, **kwargs)
        return split.data, split.targets
    x, y = pooled(download_splits(dataset_cls.__name__, open_split, raw_dir, SOURCE_HINT))
    return images_to_float(x), y
