"""How close a reconstructed image is to the real one: PSNR and SSIM, both on the [0, 1] pixel scale.

Every image generator of this project stores a pixel ``p`` of 0..P as ``(p / P - 0.5) / 0.5``, a value in
[-1, 1] (PFLlib's ``ToTensor`` + ``Normalize(0.5, 0.5)``, ``dataset/utils/raw_data.py``). Both measures are
taken on ``(x + 1) / 2``: a real image maps back exactly onto its pixels in [0, 1], and a reconstruction,
which the attack leaves unbounded, is clipped to [0, 1] as it would be to be shown. The peak value is then
1, and the numbers mean what they mean for any 8-bit image scaled to [0, 1].

PFLlib instead compares a sigmoid of the dummy, in [0, 1], with the real image as the model takes it, in
[-1, 1], and divides the mean squared error by 3 (which adds 4.8 dB): the two images are on different
scales, so its figures and these are not comparable.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment

# Identical images have an MSE of 0 and an infinite PSNR. The MSE is floored here, so they score
# 10 log10(1 / 1e-10) = 100 dB, a finite cap (PFLlib's 100 too) that keeps means over images finite.
MSE_FLOOR = 1e-10
PSNR_CAP = 10.0 * math.log10(1.0 / MSE_FLOOR)

# SSIM's usual constants (Wang, Bovik, Sheikh and Simoncelli, IEEE TIP 2004): an 11x11 Gaussian window of
# standard deviation 1.5 pixels, K1 = 0.01 and K2 = 0.03 of the dynamic range, here 1.
SSIM_WINDOW = 11
SSIM_SIGMA = 1.5
SSIM_C1 = 0.01 ** 2
SSIM_C2 = 0.03 ** 2


def to_unit_pixels(images: torch.Tensor) -> torch.Tensor:
    """Images as the model takes them (values in [-1, 1]) -> pixels in [0, 1], clipped."""
    return ((images.detach().double() + 1.0) / 2.0).clamp(0.0, 1.0)


def psnr(reconstructed: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Peak signal-to-noise ratio in dB of each image (N x C x H x W, pixels in [0, 1], peak 1):
    ``10 log10(1 / MSE)``, at most :data:`PSNR_CAP` (identical images)."""
    mse = ((reconstructed.double() - real.double()) ** 2).flatten(1).mean(dim=1)
    return 10.0 * torch.log10(1.0 / mse.clamp_min(MSE_FLOOR))


def ssim(reconstructed: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Structural similarity of each image (N x C x H x W, pixels in [0, 1]): the mean over channels and
    window positions of the SSIM map, 1 for identical images.

    The window is Gaussian, :data:`SSIM_WINDOW` pixels wide, or the largest odd width the image holds when
    it is smaller (Digits' 8x8: 7), and slides over the image without padding, so no position mixes in
    pixels that are not there."""
    a, b = reconstructed.double(), real.double()
    channels, height, width = a.shape[1:]
    size = min(SSIM_WINDOW, height, width)
    size -= 1 - size % 2  # odd: the window has a centre
    window = _gaussian_window(size, SSIM_SIGMA).to(a.device)
    window = window.expand(channels, 1, size, size)

    def local_mean(x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, window, groups=channels)

    mean_a, mean_b = local_mean(a), local_mean(b)
    var_a = local_mean(a * a) - mean_a ** 2
    var_b = local_mean(b * b) - mean_b ** 2
    cov = local_mean(a * b) - mean_a * mean_b
    luminance = (2 * mean_a * mean_b + SSIM_C1) / (mean_a ** 2 + mean_b ** 2 + SSIM_C1)
    structure = (2 * cov + SSIM_C2) / (var_a + var_b + SSIM_C2)
    return (luminance * structure).flatten(1).mean(dim=1)


def _gaussian_window(size: int, sigma: float) -> torch.Tensor:
    """A ``size`` x ``size`` Gaussian of standard deviation ``sigma`` pixels, summing to 1."""
    offsets = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    line = torch.exp(-0.5 * (offsets / sigma) ** 2)
    line /= line.sum()
    return torch.outer(line, line)


def match_images(reconstructed: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """The order of ``reconstructed`` that pairs each real image with one reconstruction, the pairs of
    smallest total squared error. A batch's gradient is a sum over its samples, so the attack rebuilds them
    in no particular order; scoring them in the order drawn would count a perfect reconstruction of a
    batch of two as a failure whenever the two came out swapped."""
    errors = ((reconstructed.double()[:, None] - real.double()[None]) ** 2).flatten(2).mean(dim=2)
    rows, columns = linear_sum_assignment(errors.cpu().numpy())
    order = np.empty(len(columns), dtype=np.int64)
    order[columns] = rows
    return torch.as_tensor(order, device=reconstructed.device)
