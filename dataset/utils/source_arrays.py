"""A generator's local ``--source`` ``.npz``, read through one checked path.

Every generator that takes such a file (MNIST, FashionMNIST, EMNIST, Cifar10, Cifar100, Digits, Tiny
ImageNet, Omniglot, Digit5, and the text datasets' token ids) reads it with :func:`read_source_npz`, and
checks its labels with :func:`check_labels`; image datasets check their images with
:func:`check_images`. What the arrays' headers tell (kinds, shapes, matching lengths, no Python objects,
no claim larger than the file holds) is refused before anything is loaded; what only the values tell
(labels below zero, or more classes than images, which would make the partition allocate gigabytes) right
after, before any partition. Each refusal is one :class:`DatasetFileError` line naming the file.
"""
from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np

from dataset.utils.client_files import DatasetFileError
from dataset.utils.npz_limits import NpzLimitError, check_npz

IMAGE_FORM = "uint8 images, N x H x W (grey) or N x H x W x 3 (RGB)"


def read_source_npz(source: Path, x_form: str = IMAGE_FORM,
                    x_problem=lambda shape, dtype: None) -> Tuple[np.ndarray, np.ndarray]:
    """The arrays ``x`` and ``y`` of ``source``, once their headers pass :func:`check_npz`, hold no Python
    objects, agree in length, give ``y`` as whole-number labels and pass ``x_problem(shape, dtype)`` (a
    reason to refuse x, or None; ``x_form`` describes what x must be)."""
    source = Path(source)
    if not source.is_file():
        raise FileNotFoundError(f"--source file {source} does not exist")
    try:
        headers = check_npz(source)
    except NpzLimitError as err:
        raise DatasetFileError(str(err)) from None
    except (OSError, zipfile.BadZipFile, ValueError, EOFError) as err:
        raise DatasetFileError(f"{source} is not a readable .npz ({_first_line(err)}); expected {x_form} 'x' "
                               f"and integer labels 'y'") from None
    if not {"x", "y"} <= set(headers):
        raise DatasetFileError(f"{source} must hold arrays 'x' and 'y', found {sorted(headers)}")
    (x_shape, x_dtype), (y_shape, y_dtype) = headers["x"], headers["y"]
    problem = (_objects_problem(x_dtype, y_dtype) or x_problem(x_shape, x_dtype)
               or labels_form_problem(y_shape, y_dtype, x_shape[0] if x_shape else None))
    if problem:
        raise DatasetFileError(f"{source}: {problem}")
    try:
        with np.load(source, allow_pickle=False) as npz:
            return npz["x"], npz["y"]
    except MemoryError:
        raise DatasetFileError(f"{source}: not enough memory to load x {x_shape} ({x_dtype}); free memory, or "
                               f"use a smaller source") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise DatasetFileError(f"cannot read {source}: {_first_line(err)}; the file is truncated or corrupt") from None


def labels_form_problem(shape: Sequence[int], dtype: np.dtype, count: Optional[int]) -> Optional[str]:
    """Why ``y`` of this shape and dtype cannot hold one whole-number label per sample of ``count``."""
    if count == 0:
        return "x holds no samples"
    if dtype.kind not in "iu" or len(shape) != 1 or count is None or shape[0] != count:
        return f"y must hold one whole-number label per sample of x ({count}); got {dtype} {tuple(shape)}"
    return None


def check_labels(y: np.ndarray, where: str) -> np.ndarray:
    """``y`` as int64, once every label is found in 0..N-1 for N samples: a negative one would be dropped by
    the partition, and one of 10**9 would make it allocate a class table of gigabytes."""
    low, high = int(y.min()), int(y.max())
    if low < 0:
        raise DatasetFileError(f"{where}: y holds label {low}; labels are 0..C-1 for C classes")
    if high >= len(y):
        raise DatasetFileError(f"{where}: y holds label {high}, which asks for more classes than the {len(y)} "
                               f"samples; labels are 0..C-1 for C classes")
    return y.astype(np.int64)


def image_form_problem(shape: Sequence[int], dtype: np.dtype) -> Optional[str]:
    """Why an ``x`` of this shape and dtype does not hold :data:`IMAGE_FORM` (a trailing channel of 1 is grey)."""
    shape = tuple(shape)
    ok = dtype == np.uint8 and (len(shape) == 3 or (len(shape) == 4 and shape[3] in (1, 3)))
    if not ok or 0 in shape[1:]:
        return f"x must hold {IMAGE_FORM}; got {dtype} {shape}"
    return None


def check_images(x: np.ndarray, y: np.ndarray, where: str) -> Tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` as uint8 N x H x W (grey) or N x H x W x 3 and int64 N, or a :class:`DatasetFileError`
    naming ``where`` and what is wrong. A trailing channel of 1 is dropped (grey)."""
    x, y = np.asarray(x), np.asarray(y)
    problem = (_objects_problem(x.dtype, y.dtype) or image_form_problem(x.shape, x.dtype)
               or labels_form_problem(y.shape, y.dtype, len(x) if x.ndim else None))
    if problem:
        raise DatasetFileError(f"{where}: {problem}")
    if x.ndim == 4 and x.shape[3] == 1:
        x = x[..., 0]
    return x, check_labels(y, where)


def read_image_npz(source: Path) -> Tuple[np.ndarray, np.ndarray]:
    """A local ``--source`` copy of an image dataset: uint8 ``x`` and integer ``y``, checked."""
    x, y = read_source_npz(source, IMAGE_FORM, image_form_problem)
    return check_images(x, y, str(source))


def _objects_problem(*dtypes: np.dtype) -> Optional[str]:
    if any(dtype.hasobject for dtype in dtypes):
        return "x and y must be plain arrays of numbers, not arrays of Python objects (pickled)"
    return None


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
