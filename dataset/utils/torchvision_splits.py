"""torchvision downloads kept as uint8 arrays, for datasets that are resized before they become floats.

``raw_data.load_torchvision`` suits a dataset stored as torchvision gives it (``train=True/False``,
``data``, ``targets``, already the stored size). Omniglot (background and evaluation sets, PIL images)
and Digit5's domains (SVHN's ``split`` and channel-first ``data``; every domain resized) do not fit it,
so a generator says how to open one split (:data:`SplitOpener`) and this module does the rest as
``load_torchvision`` does: download into ``rawdata/``, remove what a failed download wrote, and turn the
failure into one line that says how to build offline.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, List, Sequence, Tuple

import numpy as np

from dataset.utils.raw_data import DownloadError, removed_on_failure

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
        reason = " ".join(str(getattr(err, "reason", None) or err).split())[:200]
        raise DownloadError(f"could not download {name} ({reason}); {hint}") from None


def pooled(parts: Sequence[Tuple[np.ndarray, np.ndarray]]) -> Tuple[np.ndarray, np.ndarray]:
    """The splits as one dataset: every client's data is re-split 75/25 after partitioning anyway."""
    return (np.concatenate([np.asarray(x) for x, _ in parts]),
            np.concatenate([np.asarray(y) for _, y in parts]).astype(np.int64))
