"""Client data in memory: read from disk once, kept as tensors, batched by index permutations.

PFLlib rebuilds a Python list of per-sample tensors and a DataLoader on every ``train()`` and
``evaluate()`` call; here each client's arrays are read once into two tensors (on the training
device) and a batch is one indexed gather.
"""
from __future__ import annotations

import math
import shlex
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from dataset.utils.client_files import (IMAGE_INPUTS, DatasetFileError, client_file, content_hash,
                                        read_client_arrays, read_config)
from utils.errors import UserError
from utils.input_kinds import config_inputs, file_inputs_problem, inputs_tensor
from utils.paths import DATASET_DIR, check_name, display_path

Batch = Tuple[torch.Tensor, torch.Tensor]


class DatasetError(UserError, ValueError):
    """A dataset problem the user can fix; the message says how."""


@dataclass
class ClientData:
    """One client's split: ``x`` (N x C x H x W float32 images, or N x L int64 token ids) and ``y`` (N
    int64), on one device."""
    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def train_batches(self, batch_size: int, generator: torch.Generator) -> Iterator[Batch]:
        """Shuffled minibatches, dropping the last incomplete one (PFLlib's train loader).

        A client smaller than one batch still trains on all of its samples as a single batch.
        """
        n = len(self)
        order = torch.randperm(n, generator=generator).to(self.y.device)
        stop = max(n - batch_size + 1, 1)
        for start in range(0, stop, batch_size):
            index = order[start:start + batch_size]
            yield self.x[index], self.y[index]

    def eval_batches(self, batch_size: int = 512) -> Iterator[Batch]:
        """Consecutive slices, no shuffling: evaluation order does not matter."""
        for start in range(0, len(self), batch_size):
            yield self.x[start:start + batch_size], self.y[start:start + batch_size]

    def split_off(self, fraction: float, seed: Sequence[int]) -> Tuple["ClientData", "ClientData"]:
        """``(rest, held out)``: ``round(fraction * N)`` samples drawn by ``seed`` are held out (at least
        one, and at least one is left); both parts keep the file order, so the rest trains as the whole
        would with its samples removed."""
        n = len(self)
        count = min(max(1, round(fraction * n)), n - 1)
        held = np.zeros(n, dtype=bool)
        held[np.random.default_rng(list(seed)).choice(n, size=count, replace=False)] = True
        keep = torch.as_tensor(~held, device=self.y.device)
        return ClientData(self.x[keep], self.y[keep]), ClientData(self.x[~keep], self.y[~keep])


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


def generate_command(name: str, num_clients: int, data_root: Optional[Path] = None) -> str:
    """The command that builds the missing folder ``<data_root>/<name>`` for ``num_clients`` clients
    (partition parameters spelled in a ``run_all.sh`` name, ``MNIST-dir0.1-nc10``, are kept)."""
    folder = Path(data_root or DATASET_DIR) / name
    command = rebuild_command(folder, _split_from_name(name, num_clients), exists=False)
    base = _generator_of(name, {})
    if command.startswith("python ") and base != "Digits":
        command += f" (offline: add {OFFLINE_SOURCES.get(base, IMAGE_SOURCE)})"
    return command


# How each generator builds without a network, for the hint of a missing dataset.
IMAGE_SOURCE = "--source FILE.npz holding uint8 x and labels y"
OFFLINE_SOURCES = {
    "AGNews": "--source FILE.csv, the CSV release's rows: class index, title, description",
    "SogouNews": "--source sogou_news_csv.tgz, its unpacked folder (train.csv, test.csv) or one CSV",
    "Shakespeare": "--source FILE.json, LEAF's preprocessed Shakespeare (required: it is never downloaded)",
    "FEMNIST": "--source FILE.json, LEAF's preprocessed FEMNIST (required: it is never downloaded)",
    "HAR": "--source 'UCI HAR Dataset.zip' or its unpacked folder",
    "PAMAP2": "--source PAMAP2_Dataset.zip or its unpacked folder",
    "TinyImagenet": "--source tiny-imagenet-200.zip, its unpacked folder, or an .npz of uint8 x and labels y",
    "Digit5": "--source FOLDER holding mnist.npz, mnistm.npz, svhn.npz, syn.npz and usps.npz",
}
# Datasets split by who made the data (one client per speaker, writer or subject), not by label.
NATURAL_SPLITS = ("Shakespeare", "FEMNIST", "HAR", "PAMAP2")
# Generators whose default split is not PFLlib's Dirichlet one (Digit5: IID within each domain).
DEFAULT_SPLITS = {"Digit5": {"non_iid": False, "partition": "iid"}}


def rebuild_command(folder: Path, split: Mapping, exists: bool = True) -> str:
    """The exact generator command that (re)builds ``folder`` with the partition ``split`` (a config
    or :class:`PartitionOptions` as a dict): its client count, scheme, alpha, seed, name and root;
    ``--force`` when the folder exists, since the generator keeps an existing folder otherwise."""
    folder = Path(folder)
    base = _generator_of(folder.name, split)
    if base is None:
        return f"a generator that writes {display_path(folder)}/{{train,test}}/<id>.npz and config.json"
    non_iid = split.get("non_iid", True) is not False
    scheme = split.get("partition", "dir") if non_iid else "iid"
    words = ["python", f"dataset/generate_{base}.py", "noniid" if non_iid else "iid",
             "balance" if split.get("balance") is True else "-", scheme if non_iid else "-",
             "--num-clients", str(split.get("num_clients", 20))]
    if scheme in ("dir", "exdir") and split.get("alpha") is not None:
        words += ["--alpha", str(split["alpha"])]
    if scheme in ("pat", "exdir") and split.get("class_per_client") is not None:
        words += ["--class-per-client", str(split["class_per_client"])]
    if split.get("seed", 1) != 1:
        words += ["--seed", str(split["seed"])]
    if split.get("min_samples") is not None:
        words += ["--min-samples", str(split["min_samples"])]
    if split.get("label_groups", 1) != 1:
        words += ["--label-groups", str(split["label_groups"])]
    settings = split.get("generator_settings")
    for key, value in (settings.items() if isinstance(settings, dict) else ()):
        words += [f"--{key.replace('_', '-')}", str(value)]
    if folder.name != base:
        words += ["--name", folder.name]
    if folder.parent.resolve() != DATASET_DIR.resolve():
        words += ["--root", display_path(folder.parent)]
    if exists:
        words.append("--force")
    return " ".join(shlex.quote(w) for w in words)


def _generator_of(name: str, split: Mapping) -> Optional[str]:
    """The ``dataset/generate_<base>.py`` that builds folder ``name``: the config's ``source``, else the
    longest ``-``-separated prefix of the name with a generator (``MNIST-dir0.1`` -> ``MNIST``)."""
    source = split.get("source")
    parts = name.split("-")
    candidates = ([source] if isinstance(source, str) else []) + ["-".join(parts[:k]) for k in range(len(parts), 0, -1)]
    for base in candidates:
        if base and "/" not in base and "\\" not in base and (DATASET_DIR / f"generate_{base}.py").is_file():
            return base
    return None


def _split_from_name(name: str, num_clients: int) -> dict:
    """Partition parameters a folder name spells in ``run_all.sh``'s convention (``<base>-<partition>``,
    optionally ``-nc<N>``); the Digits folders hold the default split."""
    base = _generator_of(name, {})
    if base == "Digits":
        digits = _digits()
        clients = num_clients
        if name != "Digits" and name.startswith("Digits-nc") and name[len("Digits-nc"):].isdigit():
            clients = int(name[len("Digits-nc"):])
        if name == digits.digits_folder(clients):
            return asdict(digits.digits_options(clients))
    split: dict = {"num_clients": num_clients}
    if base in NATURAL_SPLITS:
        split["partition"] = "natural"
    split.update(DEFAULT_SPLITS.get(base, {}))
    if base is None or name == base:
        return split
    words = name[len(base) + 1:].split("-")
    if words and words[-1].startswith("nc") and words[-1][2:].isdigit():
        split["num_clients"] = int(words.pop()[2:])
    if words and words[-1].startswith("lg") and words[-1][2:].isdigit():
        split["label_groups"] = int(words.pop()[2:])
    token = "-".join(words)
    for scheme, key in (("exdir", "alpha"), ("dir", "alpha"), ("pat", "class_per_client"), ("iid", None)):
        if token.startswith(scheme):
            value = token[len(scheme):]
            if key is None and not value:
                split.update(non_iid=False, partition="iid")
            elif key == "alpha" and _is_number(value):
                split.update(partition=scheme, alpha=float(value))
            elif key == "class_per_client" and value.isdigit():
                split.update(partition=scheme, class_per_client=int(value))
            break
    return split


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _digits():
    """The embedded dataset's generator module (its default split and folder names)."""
    import dataset.generate_Digits as digits
    return digits


def _data_root(data_dir: Optional[Path]) -> Path:
    root = Path(data_dir or DATASET_DIR)
    if root.exists() and not root.is_dir():
        raise DatasetError(f"--data_dir {display_path(root)} is a file, not a folder; pass the folder that "
                           f"holds <dataset>/ (default: dataset/)")
    return root


def dataset_folder(name: str, clients_needed: int, data_dir: Optional[Path] = None) -> Path:
    """The folder ``-data name`` reads for a run of ``clients_needed`` clients (-nc plus -nnc).

    ``name`` must be a plain folder name (no separator, no ``..``). For the embedded Digits this is
    ``Digits`` (the documented 20-client split) or, for another client count, ``Digits-nc<N>``.
    """
    check_name(name, "-data", DatasetError)
    root = _data_root(data_dir)
    if name == "Digits":
        return root / _digits().digits_folder(clients_needed)
    return root / name


def _closest_dataset(name: str, data_root: Path) -> Optional[str]:
    """The dataset folder or generator name ``name`` was probably meant to be (``cifar10`` -> ``Cifar10``)."""
    from flcore.registry import closest_name
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
    expected = _split_from_name(root.name, clients_needed)
    try:
        config = read_config(root)
    except DatasetFileError as err:
        raise DatasetError(f"{err}; regenerate it with: {rebuild_command(root, expected)}") from None
    where = display_path(root / "config.json")
    if name == "Digits":
        from dataset.utils.generate import split_differences
        differences = split_differences(config, _digits().digits_options(expected["num_clients"]))
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
            x, _ = _read(root, split, i, rebuild)
            sizes.append(len(x))
            shape = tuple(x.shape[1:])
    return shape, tuple(train), tuple(test)


def _read(root: Path, split: str, client_id: int, rebuild: str) -> Tuple[np.ndarray, np.ndarray]:
    try:
        return read_client_arrays(client_file(root, split, client_id))
    except DatasetFileError as err:
        raise DatasetError(f"{err}; regenerate it with: {rebuild}") from None


def load_client_data(info: DatasetInfo, client_id: int, split: str, device: torch.device, *,
                     num_classes: int, few_shot: int = 0, channels_last: bool = False) -> ClientData:
    """Read one client's ``train`` or ``test`` file into tensors on ``device``, checking it.

    The file must agree with ``config.json`` (sample count, and content hash where recorded), hold
    inputs of the dataset's kind and shape (finite real images, or integer token ids below its
    vocab_size) and integer labels in ``[0, num_classes)``.
    """
    rebuild = info.rebuild or rebuild_command(info.root, {"num_clients": info.num_clients})
    x, y = _read(info.root, split, client_id, rebuild)
    where = display_path(client_file(info.root, split, client_id))
    if y.dtype.kind not in "iu":
        raise DatasetError(f"{where}: labels y have dtype {y.dtype}; they must be integers 0..C-1 "
                           f"(regenerate it with: {rebuild})")
    problem = file_inputs_problem(x, info.input_kind, info.input_shape, info.vocab_size)
    if problem:
        raise DatasetError(f"{where}: {problem} (regenerate it with: {rebuild})")
    if y.ndim != 1 or len(x) != len(y):
        raise DatasetError(f"{where}: x has shape {x.shape} and y {y.shape}, expected "
                           f"(N, {', '.join(map(str, info.input_shape))}) and (N,)")
    sizes = info.train_samples if split == "train" else info.test_samples
    if client_id < len(sizes) and len(y) != sizes[client_id]:
        raise DatasetError(f"{where} holds {len(y)} samples but {display_path(info.root / 'config.json')} says "
                           f"{sizes[client_id]}: the folder mixes files of different builds; regenerate it "
                           f"with: {rebuild}")
    if len(y) and y.min() < 0:
        raise DatasetError(f"{where}: label {int(y.min())} is negative; labels must be 0..C-1 "
                           f"(regenerate it with: {rebuild})")
    if len(y) and y.max() >= num_classes:
        raise DatasetError(f"{where}: labels span [{y.min()}, {y.max()}] but the model has "
                           f"{num_classes} classes; raise -ncl to at least {int(y.max()) + 1}")
    hashes = info.train_sha256 if split == "train" else info.test_sha256
    if hashes is not None and content_hash(x, y) != hashes[client_id]:
        raise DatasetError(f"{where} is not the file the generator wrote (its content hash differs from "
                           f"{display_path(info.root / 'config.json')}): the folder mixes files of different "
                           f"builds or was changed; regenerate it with: {rebuild}")
    if split == "train" and few_shot > 0:
        keep = _first_per_label(y, few_shot)
        x, y = x[keep], y[keep]
    x_t = inputs_tensor(x, info.input_kind, channels_last)
    return ClientData(x_t.to(device), torch.as_tensor(y.astype(np.int64)).to(device))


# Seeds the choice of each client's --val_ratio samples (with the client id), apart from every other stream.
VALIDATION_STREAM = 0x7a1


def load_client_splits(info: DatasetInfo, client_id: int, device: torch.device, *, num_classes: int,
                       few_shot: int = 0, channels_last: bool = False, val_ratio: float = 0.0
                       ) -> Tuple[ClientData, ClientData, Optional[ClientData]]:
    """``(train, test, validation)`` of one client: its two files, and with ``val_ratio`` > 0 that fraction
    of the train samples held out as validation (None otherwise). The held-out samples depend only on the
    client, the same for every seed, so seeds vary the model and not the data."""
    def load(split: str, shots: int) -> ClientData:
        return load_client_data(info, client_id, split, device, num_classes=num_classes, few_shot=shots,
                                channels_last=channels_last)

    train, test = load("train", few_shot), load("test", 0)
    if len(train) == 0 or len(test) == 0:
        raise DatasetError(f"client {client_id} of {info.name} has {len(train)} train and {len(test)} test "
                           f"samples; every client needs at least one of each")
    if val_ratio <= 0:
        return train, test, None
    if len(train) < 2:
        raise DatasetError(f"client {client_id} of {info.name} has 1 train sample, too few to hold out a "
                           f"validation set (--val_ratio {val_ratio})")
    train, val = train.split_off(val_ratio, seed=(VALIDATION_STREAM, client_id))
    return train, test, val


def _first_per_label(y: np.ndarray, k: int) -> np.ndarray:
    """Indices of the first ``k`` samples of every label, in file order (PFLlib's few-shot rule)."""
    keep: List[int] = []
    seen: dict = {}
    for i, label in enumerate(y.tolist()):
        if seen.get(label, 0) < k:
            seen[label] = seen.get(label, 0) + 1
            keep.append(i)
    return np.asarray(keep, dtype=np.int64)


def embedded_split(name: str, num_clients: int):
    """The split an embedded Digits folder name stands for, or None for any other name.

    ``Digits`` is the default split (``Digits-nc<N>`` for another client count); a name in
    ``run_all.sh``'s convention (``Digits-dir0.5``, ``Digits-iid-lg4-nc40``) is that partition with the
    default's other settings. A Digits name that does not spell a partition is None (a typo is not
    silently built as something else)."""
    if _generator_of(name, {}) != "Digits":
        return None
    split = _split_from_name(name, num_clients)
    if "partition" not in split:
        return None
    return replace(_digits().DIGITS_DEFAULT, **split)


def ensure_default_dataset(name: str, num_clients: int, data_dir: Optional[Path] = None) -> Optional[Path]:
    """Build an embedded Digits split on first use (see :func:`embedded_split`); other datasets are
    never built implicitly. Returns the folder built, or None."""
    root = dataset_folder(name, num_clients, data_dir)
    options = embedded_split(root.name, num_clients)
    if options is None or root.exists():
        return None
    from dataset.utils.generate import build_dataset
    print(f"first use of {name}: partitioning it into {options.num_clients} clients under {display_path(root)} ...",
          flush=True)
    x, y = _digits().load_raw()
    # Another process may build the same folder at the same time: keep whichever lands first.
    build_dataset(root, x, y, options, source="Digits", replace=False)
    return root
