"""Partition MNIST into per-client files under dataset/MNIST/.

Usage (PFLlib's argv, plus named options; see --help)::

    python dataset/generate_MNIST.py noniid - dir --alpha 0.1
    python dataset/generate_MNIST.py noniid - dir --source path/to/mnist.npz   # offline
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataset.utils.generate import load_source_npz, load_torchvision, main  # noqa: E402


def load_raw(source, raw_dir):
    if source is not None:
        return load_source_npz(source)
    from torchvision.datasets import MNIST
    return load_torchvision(MNIST, raw_dir)


if __name__ == "__main__":
    sys.exit(main("MNIST", load_raw, sys.argv[1:], default_class_per_client=2))
