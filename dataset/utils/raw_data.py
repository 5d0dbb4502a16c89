"""The raw arrays a generator partitions: images as floats, a local ``--source`` copy, and downloads
that leave nothing behind when they fail.

A download that fails removes what it wrote (:func:`removed_on_failure`) and ends in one
:class:`DownloadError` line that says how to build the dataset offline; torchvision's datasets are
downloaded by :mod:`dataset.utils.torchvision_splits`.
"""
from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional, Tuple

import numpy as np

from dataset.utils.client_files import DatasetFileError
from dataset.utils.source_arrays import read_image_npz

# (source file or None, folder for downloads, **generator settings) -> (x float32 N x C x H x W, y int64 N),
# or (x, y, inputs) where ``inputs`` are the config.json entries describing another kind of x
# (token ids: see dataset/utils/client_files.py).
RawLoader = Callable[..., tuple]


class DownloadError(DatasetFileError):
    """A dataset could not be downloaded; the message names ``--source`` as the offline way."""


SOURCE_HINT = ("build it offline with --source FILE.npz, a NumPy file holding uint8 images 'x' "
               "(N x H x W or N x H x W x C) and integer labels 'y'")


def images_to_float(x: np.ndarray, max_value: float = 255.0) -> np.ndarray:
    """uint8 images (N x H x W or N x H x W x C) -> float32 N x C x H x W in [-1, 1].

    This is PFLlib's ``ToTensor`` + ``Normalize(0.5, 0.5)``, applied once at generation.
    """
    x = np.asarray(x, dtype=np.float32) / max_value
    x = x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2)
    return np.ascontiguousarray((x - 0.5) / 0.5)


def load_source_npz(source: Path) -> Tuple[np.ndarray, np.ndarray]:
    """A local copy of an image dataset, read and checked by
    :func:`~dataset.utils.source_arrays.read_image_npz`: as float images (N x C x H x W) and int64 labels."""
    x, y = read_image_npz(source)
    return images_to_float(x), y


@contextmanager
def removed_on_failure(raw_dir: Path) -> Iterator[None]:
    """Around a download into ``raw_dir``: if it fails, remove what it created (the folders it had to
    make, or the files it added to an existing ``raw_dir``), then let the error through."""
    raw_dir = Path(raw_dir)
    created_top = _first_missing_ancestor(raw_dir)
    existed = set(raw_dir.rglob("*")) if created_top is None else set()
    try:
        yield
    except BaseException:
        _remove_new_paths(raw_dir, created_top, existed)
        raise


def _first_missing_ancestor(path: Path) -> Optional[Path]:
    """The top-most of ``path`` and its parents that does not exist yet (None when ``path`` exists)."""
    missing = None
    for candidate in (path, *path.parents):
        if candidate.exists():
            break
        missing = candidate
    return missing


def _remove_new_paths(raw_dir: Path, created_top: Optional[Path], existed: set) -> None:
    """Undo a failed download: the folders it created, or the files it added to an existing ``raw_dir``."""
    if created_top is not None:
        shutil.rmtree(created_top, ignore_errors=True)
        return
    # Deepest first, so folders are empty when their turn comes.
    for path in sorted(set(raw_dir.rglob("*")) - existed, key=lambda p: len(p.parts), reverse=True):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
