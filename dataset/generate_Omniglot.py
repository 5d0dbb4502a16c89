"""Partition Omniglot (1,623 handwritten characters of 50 alphabets, 20 drawings each) into per-client files.

torchvision's ``Omniglot``: its background (964 characters) and evaluation (659) sets are pooled, the
evaluation set's labels following the background's (0-963, then 964-1622), which gives PFLlib's 1,623
classes. Every 105x105 drawing is resized to 28x28 grey (bilinear, averaging; see
``dataset/utils/images.py``), the size of MNIST and of the models' small-image settings: PFLlib keeps
105x105 (14 times the pixels, 1.4 GB as floats). Then the usual label partitions apply, as for MNIST
(default Dirichlet(0.1) over 20 clients); PFLlib instead gives client i the i-th drawing of every
character (always 20 clients, each holding every class)::

    python dataset/generate_Omniglot.py noniid - dir --alpha 0.1
    python dataset/generate_Omniglot.py iid balance - --source omniglot.npz     # offline
    python system/main.py -data Omniglot -m CNN

With 20 drawings per class, ``iid`` needs ``balance`` (an unbalanced IID cut of 20 drawings among 20
clients gives most of them none), and ``pat`` / ``exdir`` need ``--class-per-client`` in the hundreds
to reach all 1,623 classes; ``dir`` fits. ``--source`` is a ``.npz`` of uint8 drawings ``x``
(N x H x W, any size: resized to 28x28) and labels ``y``.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from dataset.utils.command_line import main as generate_main  # noqa: E402
from dataset.utils.images import GREY, float_images, image_array, resize_images  # noqa: E402
from dataset.utils.source_arrays import read_image_npz  # noqa: E402
from dataset.utils.raw_data import SOURCE_HINT  # noqa: E402
from dataset.utils.torchvision_splits import download_splits, pooled, torchvision_datasets  # noqa: E402

NAME = "Omniglot"
SIZE = 28
SOURCE_HELP = ("build offline from a .npz of uint8 drawings x (N x H x W, any size: resized to 28x28) and "
               "labels y, instead of downloading")


def open_set(root: str, background: bool):
    """One of torchvision's two Omniglot sets (downloaded if needed), each drawing resized on reading."""
    drawings = torchvision_datasets().Omniglot(root, background=background, download=True)
    x = np.empty((len(drawings), SIZE, SIZE), dtype=np.uint8)
    y = np.empty(len(drawings), dtype=np.int64)
    for i in range(len(drawings)):
        image, y[i] = drawings[i]
        x[i] = image_array(image, SIZE, GREY)
    return x, y


def download(raw_dir: Path):
    """Both sets, the evaluation set's characters numbered after the background set's."""
    (x_back, y_back), (x_eval, y_eval) = download_splits("Omniglot", open_set, raw_dir, SOURCE_HINT)
    return pooled([(x_back, y_back), (x_eval, y_eval + int(y_back.max()) + 1)])


def load_raw(source, raw_dir):
    x, y = read_image_npz(source) if source is not None else download(raw_dir)
    return float_images(resize_images(x, SIZE, GREY)), y


def main(argv) -> int:
    return generate_main(NAME, load_raw, argv, source_help=SOURCE_HELP)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
