"""Images brought to the one shape a dataset stores: uint8 pixels resized and made grey or RGB, then
float32 N x C x H x W (:func:`float_images`, PFLlib's normalisation as ``raw_data.images_to_float``).

A dataset whose sources differ in size or colour (Omniglot's 105x105 drawings, Digit5's 16x16 grey to
32x32 colour digits, a Tiny ImageNet JPEG saved in grey) is resized here with PIL's bilinear filter,
which averages over every source pixel when shrinking, as torchvision's ``Resize`` does (PIL is
torchvision's own image library). Grey becomes RGB by repeating the channel; RGB becomes grey by PIL's
luminance (ITU-R 601-2).
"""
from __future__ import annotations

from typing import Tuple

import numpy as np
from PIL import Image

from dataset.utils.raw_data import images_to_float

GREY, RGB = 1, 3
_MODES = {GREY: "L", RGB: "RGB"}

# Images converted to float per step: bounds the temporary copies images_to_float makes to a few MB
# instead of three times the whole dataset (Tiny ImageNet: 5.4 GB once, not 16 GB).
FLOAT_CHUNK = 4096


def image_array(image: Image.Image, size: int, channels: int) -> np.ndarray:
    """One PIL image as uint8 ``size x size`` (grey) or ``size x size x 3`` (RGB)."""
    image = image.convert(_MODES[channels])
    if image.size != (size, size):
        image = image.resize((size, size), Image.BILINEAR)
    return np.asarray(image, dtype=np.uint8)


def image_shape(size: int, channels: int) -> Tuple[int, ...]:
    """The uint8 shape of one image of this size and colour, as :func:`image_array` gives it."""
    return (size, size) if channels == GREY else (size, size, channels)


def resize_images(x: np.ndarray, size: int, channels: int) -> np.ndarray:
    """uint8 images (as :func:`~dataset.utils.source_arrays.check_images` gives them) at ``size x size`` in grey
    or RGB; returned
    unchanged when they already are."""
    shape = image_shape(size, channels)
    if x.shape[1:] == shape:
        return x
    out = np.empty((len(x), *shape), dtype=np.uint8)
    for i, pixels in enumerate(x):
        out[i] = image_array(Image.fromarray(pixels), size, channels)
    return out


def float_images(x: np.ndarray, chunk: int = FLOAT_CHUNK) -> np.ndarray:
    """uint8 N x H x W [x 3] -> float32 N x C x H x W, converted a chunk at a time into one array."""
    channels = x.shape[3] if x.ndim == 4 else 1
    out = np.empty((len(x), channels, x.shape[1], x.shape[2]), dtype=np.float32)
    for start in range(0, len(x), chunk):
        out[start:start + chunk] = images_to_float(x[start:start + chunk])
    return out
