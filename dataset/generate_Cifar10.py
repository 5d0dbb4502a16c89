"""Partition Cifar10 into per-client files under dataset/Cifar10/.

Usage (PFLlib's argv, plus named options; see --help)::

    python dataset/generate_Cifar10.py noniid - dir --alpha 0.1
    python dataset/generate_Cifar10.py noniid - dir --source path/to/cifar10.npz   # offline
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataset.utils.generate import load_source_npz, load_torchvision, main  # noqa: E402


def load_raw(source, raw_dir):
    if source is not None:
        return load_source_npz(source)
    from torchvision.datasets import CIFAR10
    return load_torchvision(CIFAR10, raw_dir)


if __name__ == "__main__":
    sys.exit(main("Cifar10", load_raw, sys.argv[1:], default_class_per_client=2))
