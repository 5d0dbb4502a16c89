"""Partition scikit-learn's handwritten Digits (1,797 8x8 images, embedded: no download).

This is the project's default dataset: ``python system/main.py`` builds it on first use with
20 clients and a Dirichlet(0.1) label skew. By hand::

    python dataset/generate_Digits.py noniid - dir --num-clients 20 --alpha 0.1
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataset.utils.generate import images_to_float, load_source_npz, main  # noqa: E402

# Digits pixels are 4-bit intensities.
DIGITS_MAX_VALUE = 16.0
# PFLlib's 40-sample floor is out of reach for 1,797 images over 20 clients at alpha 0.1 (no draw
# in thousands meets it); 20 still leaves every client 5 test images.
DIGITS_MIN_SAMPLES = 20


def load_raw(source=None, raw_dir=None):
    if source is not None:
        return load_source_npz(source)
    from sklearn.datasets import load_digits
    digits = load_digits()
    return images_to_float(digits.images, DIGITS_MAX_VALUE), digits.target.astype("int64")


if __name__ == "__main__":
    sys.exit(main("Digits", load_raw, sys.argv[1:], default_min_samples=DIGITS_MIN_SAMPLES))
