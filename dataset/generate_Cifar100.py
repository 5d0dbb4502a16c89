"""Partition Cifar100 into per-client files under dataset/Cifar100/.

Usage (PFLlib's argv, plus named options; see --help)::

    python dataset/generate_Cifar100.py noniid - dir --alpha 0.1
    python dataset/generate_Cifar100.py noniid - dir --source path/to/cifar100.npz   # offline
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataset.utils.command_line import main  # noqa: E402
from dataset.utils.torchvision_splits import torchvision_loader  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("Cifar100", torchvision_loader("CIFAR100"), sys.argv[1:], default_class_per_client=10))
