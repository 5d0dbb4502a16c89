"""Dataset folders: where ``-data NAME`` lives, what its ``config.json`` says (checked), and the embedded
Digits splits that are built on first use.

Every problem is a :class:`DatasetError` that names the file and the command that rebuilds the folder
(:mod:`utils.dataset_hints`).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Optional, Tuple

import numpy as np

from dataset.utils.client_files import (IMAGE_INPUTS, DatasetFileError, client_file, read_client_arrays,
                                        read_config)
from utils.dataset_hints import digits_generator, generate_command, generator_of, rebuild_command, split_from_name
from utils.errors import UserError
from utils.input_kinds import config_inputs
from utils.names import closest_name
from utils.paths import DATASET_DIR, check_name, display_path


class DatasetError(UserError, ValueError):
    """A dataset problem the user can fix; the message says how."""


@dataclass(frozen=True)
class DatasetInfo:
    """A dataset folder as its ``config.json`` describes it, and the command that rebuilds it.

    ``train_sha256`` / ``test_sha256``: each client file's content hash as the generator recorded it
    (None for folders built before hashes were recorded: only sample counts are checked then).
    ``input_kind``: ``image`` (``input_shape`` (C, H, W)) or ``tokens`` (``input_shape`` (L,), ids
    below ``vocab_size``); see dataset/utils/client_files.py.
    """
    name: str
    root: Path
    num_clients: int
    num_classes: int
    input_shape: Tuple[int, ...]
    train_samples: Tuple[int, ...]
    test_samples: Tuple[int, ...]
    train_sha256: Optional[Tuple[str, ...]] = None
    test_sha256: Optional[Tuple[str, ...]] = None
    rebuild: str = ""
    input_kind: str = IMAGE_INPUTS
    vocab_size: Optional[int] = None


def _data_root(data_dir: Optional[Path]) -> Path:
    root = Path(data_dir or DATASET_DIR)
    if root.exists() and not root.is_dir():
        raise DatasetError(f"--data_dir {display_path(root)} is a file, not a folder; pass the folder that "
                           f"holds <dataset>/ (default: dataset/)")
    return root


def dataset_folder(name: str, clients_needed: int, data_dir: Optional[Path] = None) -> Path:
    """The folder ``-data name`` reads for a run of ``clients_needed`` clients (-nc plus -nnc).

    ``name`` must be a plain folder name (no separator, no ``..``). For the embedded Digits this is
    ``Digits`` (the documented 20-client split) or, for another client count, ``Digits-nc<N>``; likewise
    an embedded split named without a count (``Digits-iid-lg4``) lives in ``Digits-iid-lg4-nc<N>`` for a
    count other than 20, the folder ``run_all.sh`` names for it, so the quickstart and a grid share one
    copy. A folder of that name built before (holding exactly that many clients) is still read.
    """
    check_name(name, "-data", DatasetError)
    root = _data_root(data_dir)
    if name == "Digits":
        return root / digits_generator().digits_folder(clients_needed)
    counted = f"{name}-nc{clients_needed}"
    if (clients_needed != digits_generator().DIGITS_DEFAULT.num_clients and embedded_split(counted, clients_needed)
            and "num_clients" not in _count_spelled(name) and not _holds_clients(root / name, clients_needed)):
        return root / counted
    return root / name


def _count_spelled(name: str) -> dict:
    """``{"num_clients": N}`` when ``name`` ends in ``-nc<N>``, else ``{}``."""
    last = name.rsplit("-", 1)[-1]
    return {"num_clients": int(last[2:])} if last.startswith("nc") and last[2:].isdigit() else {}


def _holds_clients(folder: Path, clients: int) -> bool:
    """Whether ``folder`` holds a dataset of exactly ``clients`` clients (by its config.json)."""
    try:
        return read_config(folder).get("num_clients") == clients
    except (OSError, ValueError, DatasetFileError):
        return False


def _closest_dataset(name: str, data_root: Path) -> Optional[str]:
    """The dataset folder or generator name ``name`` was probably meant to be (``cifar10`` -> ``Cifar10``)."""
    folders = [p.name for p in data_root.glob("*") if (p / "config.json").is_file()] if data_root.is_dir() else []
    generators = [p.stem[len("generate_"):] for p in DATASET_DIR.glob("generate_*.py")]
    return closest_name(name, folders + generators)


def dataset_info(name: str, clients_needed: int, data_dir: Optional[Path] = None) -> DatasetInfo:
    """Read ``<data_dir>/<name>/config.json``, check it and that it has ``clients_needed`` clients.

    Every problem is a :class:`DatasetError` naming the file and the command that rebuilds the folder.
    """
    root = dataset_folder(name, clients_needed, data_dir)
    if not root.is_dir():
        guess = _closest_dataset(name, root.parent)
        if guess is not None and guess != name:
            built = (root.parent / guess).is_dir()
            raise DatasetError(f"dataset {name!r} not found in {display_path(root)}; did you mean -data {guess}?"
                               + ("" if built else f" Create it with: "
                                                   f"{generate_command(guess, clients_needed, root.parent)}"))
        raise DatasetError(f"dataset {name!r} not found in {display_path(root)}; create it with: "
                           f"{generate_command(root.name, clients_needed, root.parent)}")
    expected = split_from_name(root.name, clients_needed)
    try:
        config = read_config(root)
    except DatasetFileError as err:
        raise DatasetError(f"{err}; regenerate it with: {rebuild_command(root, expected)}") from None
    where = display_path(root / "config.json")
    if name == "Digits":
        from dataset.utils.generate import split_differences
        differences = split_differences(config, digits_generator().digits_options(expected["num_clients"]))
        if differences:
            raise DatasetError(f"{display_path(root)} holds another split than the default Digits one "
                               f"({', '.join(differences)}); regenerate it with: {rebuild_command(root, expected)}")
    rebuild = rebuild_command(root, config)
    num_clients = config.get("num_clients")
    if num_clients is None:
        raise DatasetError(f"{where} has no num_clients; regenerate it with: {rebuild}")
    if num_clients < clients_needed:
        raise DatasetError(
            f"dataset {name!r} has {num_clients} clients but {clients_needed} are needed (-nc plus "
            f"-nnc); lower -nc or regenerate it with: "
            f"{rebuild_command(root, dict(config, num_clients=clients_needed))}")
    if "input_shape" in config and "train_samples" in config:
        shape = _int_list(config, "input_shape", where, rebuild, minimum=1)
        train = _int_list(config, "train_samples", where, rebuild, length=num_clients)
        test = _int_list(config, "test_samples", where, rebuild, length=num_clients)
    else:  # PFLlib's config lacks shapes and sizes: read them off the files
        shape, train, test = _shapes_from_files(root, num_clients, rebuild)
    kind, vocab_size, problem = config_inputs(config, shape)
    if problem:
        raise DatasetError(f"{where}: {problem}; regenerate it with: {rebuild}")
    num_classes = config.get("num_classes")
    label_max = _largest_train_label(config)
    if num_classes is None:
        if label_max is None:
            raise DatasetError(f"{where} has neither num_classes nor label counts; regenerate it with: {rebuild}")
        num_classes = label_max + 1
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise DatasetError(f"{where}: num_classes is {num_classes!r}, expected a positive whole number; "
                           f"regenerate it with: {rebuild}")
    if label_max is not None and num_classes > label_max + 1:
        _warn_once(f"warning: {where} says num_classes {num_classes} but no client's train labels go above "
                   f"{label_max}: the model gets {num_classes - label_max - 1} outputs no sample trains; set "
                   f"num_classes to {label_max + 1} there if the test labels do not need more")
    hashes = config.get("content_sha256")
    train_sha = test_sha = None
    if isinstance(hashes, dict):
        train_sha, test_sha = (_hash_list(hashes.get(split), num_clients) for split in ("train", "test"))
    return DatasetInfo(name, root, num_clients, num_classes, shape, train, test, train_sha, test_sha, rebuild,
                       kind, vocab_size)


def _int_list(config: Mapping, key: str, where: str, rebuild: str, *, length: Optional[int] = None,
              minimum: int = 0) -> Tuple[int, ...]:
    values = config.get(key)
    ok = isinstance(values, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= minimum
                                          for v in values)
    if not ok or (length is not None and len(values) < length):
        wanted = f"a list of {length} whole numbers" if length is not None else "a list of whole numbers"
        raise DatasetError(f"{where}: {key} is {str(values)[:60]}, expected {wanted}; regenerate it with: {rebuild}")
    return tuple(values)


def _hash_list(values, num_clients: int) -> Optional[Tuple[str, ...]]:
    if isinstance(values, list) and len(values) >= num_clients and all(isinstance(v, str) for v in values):
        return tuple(values)
    return None


def _largest_train_label(config: Mapping) -> Optional[int]:
    """The largest label in the config's per-client train label counts, or None when it has none."""
    stats = config.get("Size of samples for labels in clients")
    try:
        labels = [int(pair[0]) for sizes in stats for pair in sizes]
    except (TypeError, ValueError, IndexError, KeyError):
        return None
    return max(labels) if labels else None


_WARNED: set = set()


def _warn_once(message: str) -> None:
    """Print a warning to stderr once per process (the config is read once per run)."""
    if message not in _WARNED:
        _WARNED.add(message)
        print(message, file=sys.stderr)


def _shapes_from_files(root: Path, num_clients: int, rebuild: str):
    train, test, shape = [], [], None
    for i in range(num_clients):
        for split, sizes in (("train", train), ("test", test)):
            x, _ = read_client_file(root, split, i, rebuild)
            sizes.append(len(x))
            shape = tuple(x.shape[1:])
    return shape, tuple(train), tuple(test)


def read_client_file(root: Path, split: str, client_id: int, rebuild: str,
                     limits: Optional[Mapping[str, int]] = None) -> Tuple[np.ndarray, np.ndarray]:
    """One client file's arrays (``limits``: the most bytes each may take, from the config), or a
    :class:`DatasetError` that names the file and how to rebuild it."""
    try:
        return read_client_arrays(client_file(root, split, client_id), limits)
    except DatasetFileError as err:
        raise DatasetError(f"{err}; regenerate it with: {rebuild}") from None


def embedded_split(name: str, num_clients: int):
    """The split an embedded Digits folder name stands for, or None for any other name.

    ``Digits`` is the default split (``Digits-nc<N>`` for another client count); a name in
    ``run_all.sh``'s convention (``Digits-dir0.5``, ``Digits-iid-lg4-nc40``) is that partition with the
    default's other settings. A Digits name that does not spell a partition is None (a typo is not
    silently built as something else)."""
    if generator_of(name, {}) != "Digits":
        return None
    split = split_from_name(name, num_clients)
    if "partition" not in split:
        return None
    return replace(digits_generator().DIGITS_DEFAULT, **split)


def ensure_default_dataset(name: str, num_clients: int, data_dir: Optional[Path] = None) -> Optional[Path]:
    """Build an embedded Digits split on first use (see :func:`embedded_split`); other datasets are
    never built implicitly. Returns the folder built, or None."""
    root = dataset_folder(name, num_clients, data_dir)
    options = embedded_split(root.name, num_clients)
    if options is None or root.exists():
        return None
    from dataset.utils.generate import build_dataset
    from dataset.utils.partition import PartitionError
    print(f"first use of {name}: partitioning it into {options.num_clients} clients under {display_path(root)} ...",
          flush=True)
    x, y = digits_generator().load_raw()
    try:
        # Another process may build the same folder at the same time: keep whichever lands first.
        build_dataset(root, x, y, options, source="Digits", replace=False)
    except PartitionError as err:
        raise DatasetError(f"cannot split Digits ({len(y)} images) into {options.num_clients} clients as "
                           f"{name!r} asks: {str(err).replace('--num-clients', '-nc')}") from None
    except OSError as err:
        raise DatasetError(f"cannot write {display_path(root)} ({err.strerror or err}); free space there or "
                           f"pass another --data_dir") from None
    return root
