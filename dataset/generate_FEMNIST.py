"""FEMNIST (LEAF): handwritten digits and letters, 62 classes, 28x28 grey, one client per writer.

Built from LEAF's preprocessed JSON (github.com/TalwalkarLab/leaf, ``data/femnist/preprocess.sh``):
``{"users": [...], "user_data": {writer: {"x": [784 pixel values in [0, 1]], "y": [label 0-61]}}}``,
labels 0-9 the digits, 10-35 the upper-case and 36-61 the lower-case letters. LEAF downloads NIST's
handwriting and cuts it into writers itself, so there is no download here: ``--source`` is one such
file or a folder of them (LEAF's ``all_data/``; or ``train/`` and ``test/`` files side by side, whose
writers' samples are pooled). Each writer's samples are split 75/25 into train and test like every other
dataset::

    python dataset/generate_FEMNIST.py --source leaf/data/femnist/data/all_data/ --num-clients 100
    python system/main.py -data FEMNIST -m CNN -nc 100

``--num-clients N`` keeps the N writers with the most samples (0, the default: every writer with at least
``--min-samples``; LEAF's full set has 3,597). Images are stored as every image dataset here:
1 x 28 x 28, normalised to [-1, 1]. LEAF writes a pixel as ``1 - grey / 255`` (ink bright, paper 0), so
each value is kept to 1/255, which loses nothing of LEAF's. PFLlib's generator repeats the grey channel
three times; one channel is the same information.
"""
import sys
from pathlib import Path
from typing import Dict, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from dataset.utils.generate import GenerateError  # noqa: E402
from dataset.utils.images import float_images  # noqa: E402
from dataset.utils.leaf import read_users  # noqa: E402
from dataset.utils.natural import Groups  # noqa: E402
from dataset.utils.natural import main as natural_main  # noqa: E402

NAME = "FEMNIST"
SIDE = 28
NUM_CLASSES = 62
SOURCE_HINT = ("FEMNIST has no download here: LEAF builds it from NIST's handwriting. Run "
               "'./preprocess.sh -s niid --sf 1.0 -k 0 -t sample' in data/femnist of "
               "github.com/TalwalkarLab/leaf, then pass --source leaf/data/femnist/data/all_data/ "
               "(a LEAF JSON file, or a folder of them)")

Writers = Dict[str, Tuple[np.ndarray, np.ndarray]]  # writer -> (uint8 N x 28 x 28, int64 labels)


def writer_arrays(x: list, y: list) -> Tuple[np.ndarray, np.ndarray]:
    """One writer's LEAF lists as uint8 images and int64 labels; ValueError says what does not fit."""
    pixels = np.asarray(x, dtype=np.float32)
    if pixels.size == 0:
        pixels = pixels.reshape(0, SIDE * SIDE)
    if pixels.shape != (len(y), SIDE * SIDE):
        raise ValueError(f"x must hold one list of {SIDE * SIDE} pixel values per label in y; got x of shape "
                         f"{pixels.shape} for {len(y)} labels")
    if pixels.size and not (0 <= pixels.min() and pixels.max() <= 1):
        raise ValueError(f"pixel values must lie in [0, 1]; found {pixels.min():g} to {pixels.max():g}")
    labels = np.asarray(y)
    if labels.size and (labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0
                        or labels.max() >= NUM_CLASSES):
        raise ValueError(f"y must be a list of whole-number labels 0-{NUM_CLASSES - 1}; got {labels.dtype} "
                         f"values {labels.min()} to {labels.max()}")
    images = np.rint(pixels * 255).astype(np.uint8).reshape(-1, SIDE, SIDE)
    return images, labels.astype(np.int64)


def join(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """A writer's arrays from two LEAF files (its train and test samples) as one."""
    return np.concatenate([first, second])


def load_writers(source, raw_dir) -> Groups:
    """The writers of LEAF's files; there is nothing to download (``raw_dir`` stays unused)."""
    if source is None:
        raise GenerateError(SOURCE_HINT)
    writers: Writers = read_users(Path(source), writer_arrays, join, noun="writer")

    def arrays(chosen: Sequence[str]):
        x = float_images(np.concatenate([writers[writer][0] for writer in chosen]))
        return x, np.concatenate([writers[writer][1] for writer in chosen]), {}

    return Groups({writer: len(labels) for writer, (_, labels) in writers.items()}, arrays, NUM_CLASSES)


def main(argv: Sequence[str]) -> int:
    return natural_main(NAME, load_writers, argv, unit="writer", description=__doc__.split("\n\n")[0],
                        source_help="LEAF's FEMNIST JSON file, or a folder of them")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
