"""Partition FashionMNIST into per-client files under dataset/FashionMNIST/.

Usage (PFLlib's argv, plus named options; see --help)::

    python dataset/generate_FashionMNIST.py noniid - dir --alpha 0.1
    python dataset/generate_FashionMNIST.py noniid - dir --source path/to/fashionmnist.npz   # offline
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataset.utils.command_line import main  # noqa: E402
from dataset.utils.torchvision_splits import torchvision_loader  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("FashionMNIST", torchvision_loader("FashionMNIST"), sys.argv[1:], default_class_per_client=2))
