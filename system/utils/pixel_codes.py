"""Images kept in memory as one byte per value: each stored float32 value replaced by its code, an index
into a palette of at most 256 floats, and decoded per batch by a lookup.

Every image generator stores ``images_to_float`` of uint8 pixels (``dataset/utils/raw_data.py``), so a
file's floats take at most 256 distinct values: those of the generator's own arithmetic on 0..255 (or on
0..16, scikit-learn's Digits). A lookup ``palette[code]`` returns those very floats, so a decoded batch is
bit for bit the batch the float array gave, and 60,000 CIFAR-10 images take 184 MB instead of 737 MB.
A file whose values are not found in a known palette (built elsewhere, with other arithmetic) gets its
own palette of its distinct values when it has at most 256, and stays float32 otherwise.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Optional, Tuple

import numpy as np

from dataset.utils.raw_data import images_to_float

# The pixel ranges the generators normalise: 8-bit images, and scikit-learn's Digits (4-bit, 0..16).
PIXEL_MAXIMA = (255, 16)
MAX_CODES = 256


@lru_cache(maxsize=None)
def generator_palette(max_value: int) -> np.ndarray:
    """The float32 values ``images_to_float`` gives pixels 0..``max_value`` (index = pixel value)."""
    pixels = np.arange(max_value + 1, dtype=np.uint8).reshape(1, max_value + 1, 1)
    palette = images_to_float(pixels, float(max_value)).reshape(-1)
    palette.flags.writeable = False
    return palette


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint32)


def _generator_codes(x: np.ndarray, max_value: int) -> Optional[np.ndarray]:
    """Codes of ``x`` in :func:`generator_palette` ``(max_value)``, or None unless every value is there."""
    palette = generator_palette(max_value)
    # The inverse of images_to_float, rounded; the bit comparison below decides, not this arithmetic.
    codes = np.rint(np.clip((x.astype(np.float64) + 1.0) * (max_value / 2.0), 0, max_value)).astype(np.uint8)
    if np.array_equal(_bits(palette[codes]), _bits(x)):
        return codes
    return None


def image_codes(x: np.ndarray) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """``(codes, palette)`` with ``palette[codes]`` bit for bit ``x`` (uint8 codes of ``x``'s shape, a
    float32 palette of at most 256 values), or None when ``x`` takes more than 256 distinct values.

    ``x``: float32 images (N x C x H x W), finite (checked by the loader before)."""
    if x.dtype != np.float32:
        return None
    x = np.ascontiguousarray(x)
    for max_value in PIXEL_MAXIMA:
        codes = _generator_codes(x, max_value)
        if codes is not None:
            return codes, generator_palette(max_value)
    # Distinct bit patterns, so that -0.0 and 0.0 (equal as floats) keep their own codes.
    values, inverse = np.unique(_bits(x), return_inverse=True)
    if len(values) > MAX_CODES:
        return None
    return inverse.astype(np.uint8).reshape(x.shape), values.view(np.float32)
