"""Partition scikit-learn's handwritten Digits (1,797 8x8 images, embedded: no download).

This is the project's default dataset: ``python system/main.py`` builds the folder ``Digits`` on
first use with the documented split, :data:`DIGITS_DEFAULT` (20 clients, Dirichlet(0.1) label skew).
A run with another client count uses (and builds) ``Digits-nc<N>``: the same split with N clients,
so the ``Digits`` folder never depends on which command ran first. By hand::

    python dataset/generate_Digits.py                     # the default split, into dataset/Digits
    python dataset/generate_Digits.py --num-clients 5     # the same split over 5 clients: Digits-nc5

Any other partition needs a ``--name`` (e.g. ``--name Digits-dir0.5``): ``Digits`` is reserved for
the default split.
"""
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataset.utils.command_line import folder_suggestion, main  # noqa: E402
from dataset.utils.generate import GenerateError, PartitionOptions  # noqa: E402
from dataset.utils.raw_data import images_to_float, load_source_npz  # noqa: E402

# Digits pixels are 4-bit intensities.
DIGITS_MAX_VALUE = 16.0

# The documented default partition of the embedded dataset: the one place to tune it.
# min_samples: PFLlib's 40-sample floor is out of reach for 1,797 images over 20 clients at alpha 0.1
# (no draw in thousands meets it); 20 still leaves every client 5 test images.
DIGITS_DEFAULT = PartitionOptions(num_clients=20, non_iid=True, balance=False, partition="dir", alpha=0.1,
                                  class_per_client=2, seed=1, min_samples=20)


def digits_options(num_clients: int) -> PartitionOptions:
    """The default split over ``num_clients`` clients."""
    return replace(DIGITS_DEFAULT, num_clients=num_clients)


def digits_folder(num_clients: int) -> str:
    """The folder of the default split over ``num_clients`` clients: ``Digits`` for the documented
    count, ``Digits-nc<N>`` for any other."""
    return "Digits" if num_clients == DIGITS_DEFAULT.num_clients else f"Digits-nc{num_clients}"


def folder_for(options: PartitionOptions) -> str:
    """Where the generator writes when ``--name`` is not given (see the module docstring)."""
    if options == digits_options(options.num_clients):
        return digits_folder(options.num_clients)
    suggestion = folder_suggestion("Digits", options, DIGITS_DEFAULT)
    if suggestion == digits_folder(options.num_clients):  # differs only in seed, balance or min-samples
        suggestion += "-custom"
    raise GenerateError(f"the Digits folders hold the default split ({DIGITS_DEFAULT.partition} alpha "
                        f"{DIGITS_DEFAULT.alpha}, seed {DIGITS_DEFAULT.seed}, min-samples "
                        f"{DIGITS_DEFAULT.min_samples}); name this one, e.g. --name {suggestion}")


def load_raw(source=None, raw_dir=None):
    if source is not None:
        return load_source_npz(source)
    from sklearn.datasets import load_digits
    digits = load_digits()
    return images_to_float(digits.images, DIGITS_MAX_VALUE), digits.target.astype("int64")


if __name__ == "__main__":
    sys.exit(main("Digits", load_raw, sys.argv[1:], defaults=DIGITS_DEFAULT, folder_for=folder_for))
