"""The feature-shift transforms (dataset/utils/feature_shift.py) on hand-computed images: rotations, each
corruption's arithmetic, reproducible noise, and the shape, dtype and range every transform keeps."""
import numpy as np
import pytest

from dataset.utils.feature_shift import (CORRUPTIONS, brightness, contrast, corrupt, corruption_problem,
                                         gaussian_blur, gaussian_kernel, gaussian_noise, jpeg, pixelate, rotate)


def image(rows, channels: int = 1) -> np.ndarray:
    """One uint8 image, 1 x C x H x W, its channels given row by row (``rows`` is C x H x W or H x W)."""
    pixels = np.asarray(rows, dtype=np.uint8)
    return (pixels[None, None] if pixels.ndim == 2 else pixels[None]).reshape(1, channels, *pixels.shape[-2:])


def test_rotation_turns_counter_clockwise_by_quarter_turns():
    x = image([[1, 2], [3, 4]])
    assert rotate(x, 0).tolist() == [[[[1, 2], [3, 4]]]]
    assert rotate(x, 1).tolist() == [[[[2, 4], [1, 3]]]]    # the right column becomes the top row
    assert rotate(x, 2).tolist() == [[[[4, 3], [2, 1]]]]
    assert rotate(x, 3).tolist() == [[[[3, 1], [4, 2]]]]
    assert np.array_equal(rotate(rotate(x, 1), 3), x)


def test_rotation_turns_every_channel_alike_and_refuses_non_square_images():
    rgb = np.arange(2 * 3 * 3 * 3, dtype=np.float32).reshape(2, 3, 3, 3)
    turned = rotate(rgb, 1)
    for n in range(2):
        for c in range(3):
            assert np.array_equal(turned[n, c], np.rot90(rgb[n, c]))
    with pytest.raises(ValueError, match="square"):
        rotate(np.zeros((1, 1, 2, 3), np.uint8), 1)


def test_contrast_pulls_each_channel_towards_its_own_mean():
    assert contrast(image([[0, 200]]), 2).tolist() == [[[[50, 150]]]]     # mean 100, factor 0.5
    assert contrast(image([[0, 200]]), 5).tolist() == [[[[85, 115]]]]     # factor 0.15
    rgb = image([[[0, 200]], [[100, 100]], [[40, 0]]], channels=3)         # channel means 100, 100, 20
    assert contrast(rgb, 2).tolist() == [[[[50, 150]], [[100, 100]], [[30, 10]]]]


def test_brightness_raises_the_hsv_value_and_keeps_hue_and_saturation():
    # Grey: v + 0.05 (12.75 in pixels) at severity 1, capped at 255.
    assert brightness(image([[100, 250]]), 1).tolist() == [[[[113, 255]]]]
    # RGB (100, 50, 0): V = 100 -> 112.75, every channel scaled by 1.1275; black becomes the grey 12.75.
    rgb = image([[[100, 0]], [[50, 0]], [[0, 0]]], channels=3)
    assert brightness(rgb, 1).tolist() == [[[[113, 13]], [[56, 13]], [[0, 13]]]]


def test_gaussian_blur_spreads_an_impulse_by_the_normalised_kernel():
    kernel = gaussian_kernel(0.4)   # severity 1: sigma 0.4 pixel, cut at ceil(1.6) = 2 pixels
    centre, side = 1 / (1 + 2 * np.exp(-3.125) + 2 * np.exp(-12.5)), np.exp(-3.125)
    assert np.allclose(kernel, centre * np.array([np.exp(-12.5), side, 1, side, np.exp(-12.5)]))
    x = np.zeros((1, 1, 5, 5), np.uint8)
    x[0, 0, 2, 2] = 255
    blurred = gaussian_blur(x, 1)[0, 0]
    # 255 k0^2 = 215.5, 255 k0 k1 = 9.5 (k1 = 0.0404): rounded to 215 and 9; diagonals 255 k1^2 = 0.4 -> 0.
    assert blurred[2, 2] == 215 and blurred[1, 2] == blurred[2, 1] == blurred[3, 2] == blurred[2, 3] == 9
    assert blurred.sum() == 215 + 4 * 9
    assert np.array_equal(gaussian_blur(np.full((1, 3, 4, 4), 90, np.uint8), 5), np.full((1, 3, 4, 4), 90))


def test_pixelate_replaces_blocks_by_their_mean():
    x = image([[0, 10, 100, 110], [20, 30, 120, 130], [40, 50, 200, 210], [60, 70, 220, 230]])
    # Severity 5 keeps int(4 x 0.65) = 2 pixels a side: four 2x2 blocks, each its mean.
    assert pixelate(x, 5)[0, 0].tolist() == [[15, 15, 115, 115], [15, 15, 115, 115],
                                             [55, 55, 215, 215], [55, 55, 215, 215]]


def test_jpeg_keeps_flat_images_and_changes_textured_ones():
    flat = np.full((1, 3, 8, 8), 77, np.uint8)
    flat[:, 1] = 150
    out = jpeg(flat, 5).astype(int)
    assert np.abs(out - flat).max() <= 2
    textured = np.random.default_rng(0).integers(0, 256, (2, 1, 16, 16), dtype=np.uint8)
    assert not np.array_equal(jpeg(textured, 5), textured)
    assert np.array_equal(jpeg(textured, 5), jpeg(textured, 5))


def test_noise_comes_from_the_stream_given_and_has_the_severity_std():
    x = np.full((4, 1, 50, 50), 128, np.uint8)
    first = gaussian_noise(x, 3, np.random.default_rng(7))
    assert np.array_equal(first, gaussian_noise(x, 3, np.random.default_rng(7)))
    assert not np.array_equal(first, gaussian_noise(x, 3, np.random.default_rng(8)))
    expected = np.rint(np.clip(128 / 255 + np.random.default_rng(7).normal(0, 0.08, x.shape), 0, 1) * 255)
    assert np.array_equal(first, expected)
    assert abs(((first - 128.0) / 255).std() - 0.08) < 0.004


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("severity", [1, 5])
def test_every_corruption_keeps_shape_dtype_and_range(name, channels, severity):
    x = np.random.default_rng(1).integers(0, 256, (3, channels, 9, 9), dtype=np.uint8)
    before = x.copy()
    out = corrupt(x, name, severity, np.random.default_rng(2))
    assert out.shape == x.shape and out.dtype == np.uint8
    assert np.array_equal(x, before)                       # the input is not changed in place
    assert not np.array_equal(out, x)


def test_none_is_the_identity_and_the_data_each_corruption_cannot_take_is_named():
    x = np.zeros((1, 1, 4, 4), np.uint8)
    assert corrupt(x, "none", 3, np.random.default_rng(0)) is x
    assert "jpeg needs grey or RGB images" in corruption_problem("jpeg", 4, 8, 8)
    assert "brightness needs grey or RGB" in corruption_problem("brightness", 2, 8, 8)
    assert "pixelate needs images of at least 2x2" in corruption_problem("pixelate", 1, 1, 8)
    assert all(corruption_problem(name, 4, 8, 8) is None for name in ("gaussian_noise", "gaussian_blur", "contrast"))
    assert all(corruption_problem(name, 1, 8, 8) is None and corruption_problem(name, 3, 8, 8) is None
               for name in CORRUPTIONS)
