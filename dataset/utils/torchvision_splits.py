"""Datasets that torchvision downloads: every split into ``rawdata/``, nothing left of a failed download.

:func:`torchvision_loader` and :func:`load_torchvision` suit a dataset stored as torchvision gives it
(``data``, ``targets``, already the stored size). Omniglot (background and evaluation sets, PIL images)
and Digit5's domains (SVHN's ``split`` and channel-first ``data``; every domain resized) do not fit
them, so such a generator says how to open one split (:data:`SplitOpener`) and :func:`download_splits`
does the rest: download into ``rawdata/``, remove what a failed download wrote, and turn the failure
into one line that says how to build offline.

torchvision is imported here only, by :func:`torchvision_datasets`, and only for a download: a build from
``--source`` never imports it. A torchvision that cannot be imported (missing, or built for another torch)
is one line naming the fix, not the traceback of its import.
"""
from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from dataset.utils.one_line import error_reason
from dataset.utils.raw_data import (SOURCE_HINT, DownloadError, RawLoader, images_to_float, load_source_npz,
                                    removed_on_failure)

# (download folder, which split) -> (uint8 images, labels) of that split; downloads when needed.
SplitOpener = Callable[[str, bool], Tuple[np.ndarray, np.ndarray]]

# The other way to build a dataset whose loader falls back on torchvision (a generator with another one,
# e.g. Digit5's folder of domains, passes its own to torchvision_datasets).
OFFLINE_HINT = "or build offline with --source FILE.npz, which needs no torchvision"
# The wheel index of a torch whose version carries a local label (2.13.0+cpu, 2.13.0+cu126).
PYTORCH_INDEX = "https://download.pytorch.org/whl/{}"
# How the length of an import error's reason is capped in the line (undefined-symbol names are long).
REASON_LIMIT = 160


class TorchvisionError(DownloadError):
    """torchvision, needed for a download, cannot be imported; the message says what to install."""


def torchvision_datasets(offline_hint: str = OFFLINE_HINT):
    """``torchvision.datasets``, or :class:`TorchvisionError` when torchvision cannot be imported: one line
    naming the installed versions, the install that fixes it, and ``offline_hint`` (how to do without)."""
    try:
        import torchvision.datasets
    # A torchvision built for another torch fails in ways that vary with the versions: RuntimeError (an
    # operator it registers is missing), OSError or ImportError (an undefined symbol in its extension),
    # AttributeError (a module left half-imported). Each means the same to a generator: no download.
    except Exception as err:
        raise TorchvisionError(torchvision_problem(err, offline_hint)) from None
    return torchvision.datasets


def torchvision_problem(err: BaseException, offline_hint: str = OFFLINE_HINT) -> str:
    """The line for a failed ``import torchvision``: not installed, or not the build the installed torch needs."""
    torch = _installed("torch")
    install = _install_command(torch)
    if isinstance(err, ModuleNotFoundError) and err.name == "torchvision":
        return (f"torchvision is not installed and this generator downloads with it; install it ({install}), "
                f"{offline_hint}")
    vision = _installed("torchvision")
    wants = _torch_requirement()
    return (f"torchvision {vision or '(version unknown)'}{f', which requires {wants},' if wants else ''} cannot be "
            f"imported beside torch {torch or '(version unknown)'} ({error_reason(err, REASON_LIMIT)}); install "
            f"the torchvision built for the installed torch ({install}), {offline_hint}")


def _installed(package: str) -> Optional[str]:
    """A package's installed version, read from its metadata (importing it is what failed)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _torch_requirement() -> Optional[str]:
    """The torch that the installed torchvision declares it needs, e.g. ``torch==2.14.0``."""
    try:
        requires = metadata.requires("torchvision") or []
    except metadata.PackageNotFoundError:
        return None
    for line in requires:
        found = re.match(r"torch\s*\(?\s*([<>=!~][^;)]*)", line)
        if found:
            return "torch" + found.group(1).replace(" ", "")
    return None


def _install_command(torch: Optional[str]) -> str:
    """pip's command for a torchvision matching ``torch``: naming torch's exact version makes pip pick the
    torchvision built for it, from torch's own index when its version has a local label (``+cpu``)."""
    if torch is None:
        return "e.g. pip install torch torchvision"
    label = torch.partition("+")[2]
    index = f" --index-url {PYTORCH_INDEX.format(label)}" if label else ""
    return f"e.g. pip install torch=={torch} torchvision{index}"


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
        return load_torchvision(getattr(torchvision_datasets(), class_name), raw_dir, **kwargs)
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
