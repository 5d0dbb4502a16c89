"""Partition EMNIST (62-class 'byclass' split) into per-client files under dataset/EMNIST/.

Usage (PFLlib's argv, plus named options; see --help)::

    python dataset/generate_EMNIST.py noniid - dir --alpha 0.1
    python dataset/generate_EMNIST.py noniid - dir --source path/to/emnist.npz   # offline
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataset.utils.command_line import main  # noqa: E402
from dataset.utils.torchvision_splits import torchvision_loader  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("EMNIST", torchvision_loader("EMNIST", split="byclass"), sys.argv[1:], default_class_per_client=2))
