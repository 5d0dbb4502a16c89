"""Image transforms of a feature shift: quarter-turn rotations and CIFAR-10-C style corruptions.

Every function is pure: uint8 images N x C x H x W (the channel-first layout the pipeline stores, C = 1
for grey, 3 for RGB) in, uint8 images of the same shape out. Noise is drawn from the NumPy ``Generator``
passed in, nothing else is random. Pixel arithmetic is done on values in [0, 1] (pixel / 255) and
rounded back to the nearest 8-bit value.

The corruptions follow Hendrycks and Dietterich, "Benchmarking Neural Network Robustness to Common
Corruptions and Perturbations" (ICLR 2019), with its CIFAR-10-C strengths for severities 1-5
(:data:`STRENGTHS`); they are written here with NumPy and PIL only (no scikit-image, no Wand):

* ``gaussian_noise``: add N(0, s^2) to each value, s the standard deviation in [0, 1] units;
* ``gaussian_blur``: a separable Gaussian of standard deviation s pixels, cut at 4 s, the border
  repeated (scikit-image's ``gaussian`` defaults);
* ``contrast``: each channel of each image pulled towards its own mean, ``(v - mean) * s + mean``;
* ``brightness``: s added to the HSV value (the largest channel), hue and saturation kept; on grey
  images the value is the pixel itself;
* ``jpeg``: encoded and decoded by PIL at quality s;
* ``pixelate``: shrunk to ``int(side * s)`` pixels a side and enlarged back, both with PIL's box filter.
"""
from __future__ import annotations

import io
import math
from typing import Callable, Dict, Optional, Tuple

import numpy as np
from PIL import Image

SEVERITIES = (1, 2, 3, 4, 5)
DEFAULT_SEVERITY = 3
# No corruption: a group listed as "none" keeps its images untouched.
NONE = "none"

# CIFAR-10-C's strength of each corruption at severity 1..5 (units in the module docstring).
STRENGTHS: Dict[str, Tuple[float, ...]] = {
    "gaussian_noise": (0.04, 0.06, 0.08, 0.09, 0.10),
    "gaussian_blur": (0.4, 0.6, 0.7, 0.8, 1.0),
    "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),
    "brightness": (0.05, 0.1, 0.15, 0.2, 0.3),
    "jpeg": (80, 65, 58, 50, 40),
    "pixelate": (0.95, 0.9, 0.85, 0.75, 0.65),
}

# uint8 N x C x H x W, severity, noise stream -> uint8 N x C x H x W
Corruption = Callable[[np.ndarray, int, np.random.Generator], np.ndarray]


def strength(name: str, severity: int) -> float:
    """The strength of corruption ``name`` at ``severity`` (1-5)."""
    return STRENGTHS[name][severity - 1]


def to_unit(images: np.ndarray) -> np.ndarray:
    """uint8 pixels -> float64 values in [0, 1]."""
    return images.astype(np.float64) / 255.0


def to_pixels(values: np.ndarray) -> np.ndarray:
    """Values in [0, 1] (clipped) -> the nearest uint8 pixels."""
    return np.rint(np.clip(values, 0.0, 1.0) * 255.0).astype(np.uint8)


def rotate(images: np.ndarray, quarter_turns: int) -> np.ndarray:
    """Images (N x C x H x W, any dtype) turned counter-clockwise by ``quarter_turns`` x 90 degrees,
    as ``np.rot90`` and ``torch.rot90`` turn them. H must equal W: a turn swaps them."""
    if images.shape[-1] != images.shape[-2]:
        raise ValueError(f"rotation needs square images, got {images.shape[-2]}x{images.shape[-1]}")
    return np.ascontiguousarray(np.rot90(images, quarter_turns % 4, axes=(-2, -1)))


def gaussian_noise(images: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Each value plus an independent normal draw from ``rng`` (one per value, in C order)."""
    std = strength("gaussian_noise", severity)
    return to_pixels(to_unit(images) + rng.normal(0.0, std, size=images.shape))


def gaussian_kernel(sigma: float) -> np.ndarray:
    """The normalised 1-D Gaussian of standard deviation ``sigma`` pixels, cut at ``ceil(4 sigma)``."""
    radius = max(1, math.ceil(4.0 * sigma))
    offsets = np.arange(-radius, radius + 1, dtype=np.float64)
    weights = np.exp(-0.5 * (offsets / sigma) ** 2)
    return weights / weights.sum()


def gaussian_blur(images: np.ndarray, severity: int, rng: Optional[np.random.Generator] = None) -> np.ndarray:
    """Rows, then columns, convolved with :func:`gaussian_kernel`; the border pixel repeats outwards."""
    kernel = gaussian_kernel(strength("gaussian_blur", severity))
    radius = len(kernel) // 2
    values = to_unit(images)
    for axis in (-2, -1):
        pad = [(0, 0)] * values.ndim
        pad[axis] = (radius, radius)
        padded = np.pad(values, pad, mode="edge")
        length = values.shape[axis]
        values = sum(weight * np.take(padded, np.arange(k, k + length), axis=axis)
                     for k, weight in enumerate(kernel))
    return to_pixels(values)


def contrast(images: np.ndarray, severity: int, rng: Optional[np.random.Generator] = None) -> np.ndarray:
    """Each channel of each image moved towards its mean over the image: ``(v - mean) * s + mean``."""
    factor = strength("contrast", severity)
    values = to_unit(images)
    means = values.mean(axis=(-2, -1), keepdims=True)
    return to_pixels((values - means) * factor + means)


def brightness(images: np.ndarray, severity: int, rng: Optional[np.random.Generator] = None) -> np.ndarray:
    """HSV value V (the largest channel) raised by s, capped at 1, hue and saturation kept.

    With hue and saturation fixed every channel is proportional to V, so each is scaled by
    ``min(V + s, 1) / V``; a black pixel (V = 0, no hue) becomes the grey ``s``. One channel: ``v + s``."""
    if images.shape[1] not in (1, 3):
        raise ValueError(f"brightness works on grey or RGB images, got {images.shape[1]} channels")
    shift = strength("brightness", severity)
    values = to_unit(images)
    value = values.max(axis=1, keepdims=True)
    raised = np.minimum(value + shift, 1.0)
    scale = np.divide(raised, value, out=np.zeros_like(value), where=value > 0)
    return to_pixels(np.where(value > 0, values * scale, raised))


def jpeg(images: np.ndarray, severity: int, rng: Optional[np.random.Generator] = None) -> np.ndarray:
    """Each image saved as a JPEG of quality s by PIL (grey as 'L', RGB as 'RGB') and decoded back."""
    if images.shape[1] not in (1, 3):
        raise ValueError(f"JPEG stores grey or RGB images, got {images.shape[1]} channels")
    quality = int(strength("jpeg", severity))
    out = np.empty_like(images)
    for i, image in enumerate(images):
        buffer = io.BytesIO()
        _as_pil(image).save(buffer, format="JPEG", quality=quality)
        buffer.seek(0)
        with Image.open(buffer) as decoded:
            out[i] = _from_pil(decoded, images.shape[1])
    return out


def pixelate(images: np.ndarray, severity: int, rng: Optional[np.random.Generator] = None) -> np.ndarray:
    """Each image shrunk to ``int(H s) x int(W s)`` pixels and enlarged back, by PIL's box filter."""
    height, width = images.shape[-2:]
    factor = strength("pixelate", severity)
    small = (int(width * factor), int(height * factor))
    if min(small) < 1:
        raise ValueError(f"pixelate needs images of at least 2x2 pixels, got {height}x{width}")
    out = np.empty_like(images)
    for i, image in enumerate(images):
        for c, channel in enumerate(image):
            shrunk = Image.fromarray(channel).resize(small, Image.BOX)
            out[i, c] = np.asarray(shrunk.resize((width, height), Image.BOX), dtype=np.uint8)
    return out


def _as_pil(image: np.ndarray) -> Image.Image:
    """One C x H x W uint8 image as a PIL image."""
    return Image.fromarray(image[0]) if image.shape[0] == 1 else Image.fromarray(image.transpose(1, 2, 0))


def _from_pil(image: Image.Image, channels: int) -> np.ndarray:
    pixels = np.asarray(image.convert("L" if channels == 1 else "RGB"), dtype=np.uint8)
    return pixels[None] if channels == 1 else pixels.transpose(2, 0, 1)


CORRUPTIONS: Dict[str, Corruption] = {
    "gaussian_noise": gaussian_noise,
    "gaussian_blur": gaussian_blur,
    "contrast": contrast,
    "brightness": brightness,
    "jpeg": jpeg,
    "pixelate": pixelate,
}


def corruption_problem(name: str, channels: int, height: int, width: int) -> Optional[str]:
    """Why images of this shape cannot take corruption ``name`` (None when they can)."""
    if name in ("brightness", "jpeg") and channels not in (1, 3):
        return f"{name} needs grey or RGB images (1 or 3 channels), these have {channels}"
    if name == "pixelate" and min(height, width) < 2:
        return f"pixelate needs images of at least 2x2 pixels, these are {height}x{width}"
    return None


def corrupt(images: np.ndarray, name: str, severity: int, rng: np.random.Generator) -> np.ndarray:
    """``images`` under corruption ``name`` at ``severity`` (``none``: returned as they are)."""
    if name == NONE:
        return images
    return CORRUPTIONS[name](images, severity, rng)
