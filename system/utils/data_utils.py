"""Client data in memory: read from disk once, kept as tensors, batched by index permutations.

PFLlib rebuilds a Python list of per-sample tensors and a DataLoader on every ``train()`` and
``evaluate()`` call; here each client's arrays are read once into two tensors (on the training
device) and a batch is one indexed gather.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import numpy as np
import torch

from utils.paths import DATASET_DIR, display_path, make_importable

make_importable()
from dataset.utils.client_files import (DatasetFileError, client_file, read_client_arrays,  # noqa: E402
                                        read_config)

Batch = Tuple[torch.Tensor, torch.Tensor]


class DatasetError(ValueError):
    """A dataset problem the user can fix; the message says how."""


@dataclass
class ClientData:
    """One client's split: ``x`` (N x C x H x W float32) and ``y`` (N int64), on one device."""
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


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    root: Path
    num_clients: int
    num_classes: int
    input_shape: Tuple[int, int, int]
    train_samples: Tuple[int, ...]
    test_samples: Tuple[int, ...]


def generate_command(name: str, num_clients: int) -> str:
    script = DATASET_DIR / f"generate_{name}.py"
    if script.is_file():
        return f"python dataset/generate_{name}.py noniid - dir --num-clients {num_clients}"
    return f"a generator that writes dataset/{name}/{{train,test}}/<id>.npz and config.json"


def dataset_info(name: str, clients_needed: int, data_dir: Optional[Path] = None) -> DatasetInfo:
    """Read ``<data_dir>/<name>/config.json`` and check it has ``clients_needed`` clients."""
    root = Path(data_dir or DATASET_DIR) / name
    if not root.is_dir():
        raise DatasetError(f"dataset {name!r} not found in {display_path(root)}; create it with: "
                           f"{generate_command(name, clients_needed)}")
    try:
        config = read_config(root)
    except DatasetFileError as err:
        raise DatasetError(f"{err}; regenerate with: {generate_command(name, clients_needed)}") from None
    num_clients = int(config.get("num_clients", 0))
    if num_clients < clients_needed:
        raise DatasetError(
            f"dataset {name!r} has {num_clients} clients but {clients_needed} are needed (-nc plus "
            f"-nnc); lower -nc or regenerate with: {generate_command(name, clients_needed)}")
    if "input_shape" in config and "train_samples" in config:
        shape = tuple(config["input_shape"])
        train, test = tuple(config["train_samples"]), tuple(config["test_samples"])
    else:  # PFLlib's config lacks shapes and sizes: read them off the files
        shape, train, test = _shapes_from_files(root, num_clients)
    if len(shape) != 3:
        raise DatasetError(f"dataset {name!r} has inputs of shape {shape}; only images (C, H, W) are supported")
    num_classes = config.get("num_classes")
    if num_classes is None:
        num_classes = max(int(k) for sizes in config["Size of samples for labels in clients"]
                          for k, _ in sizes) + 1
    return DatasetInfo(name, root, num_clients, int(num_classes), shape, train, test)


def _shapes_from_files(root: Path, num_clients: int):
    train, test, shape = [], [], None
    for i in range(num_clients):
        for split, sizes in (("train", train), ("test", test)):
            x, _ = _read(root, split, i)
            sizes.append(len(x))
            shape = tuple(x.shape[1:])
    return shape, tuple(train), tuple(test)


def _read(root: Path, split: str, client_id: int) -> Tuple[np.ndarray, np.ndarray]:
    try:
        return read_client_arrays(client_file(root, split, client_id))
    except DatasetFileError as err:
        raise DatasetError(f"{err}; regenerate with: {generate_command(root.name, client_id + 1)}") from None


def load_client_data(info: DatasetInfo, client_id: int, split: str, device: torch.device, *,
                     num_classes: int, few_shot: int = 0, channels_last: bool = False) -> ClientData:
    """Read one client's ``train`` or ``test`` file into tensors on ``device``, checking it."""
    x, y = _read(info.root, split, client_id)
    where = f"{display_path(client_file(info.root, split, client_id))}"
    if x.ndim != 4 or tuple(x.shape[1:]) != tuple(info.input_shape) or len(x) != len(y):
        raise DatasetError(f"{where}: x has shape {x.shape} and y {y.shape}, expected "
                           f"(N, {', '.join(map(str, info.input_shape))}) and (N,)")
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        raise DatasetError(f"{where}: labels span [{y.min()}, {y.max()}] but the model has "
                           f"{num_classes} classes; raise -ncl to at least {int(y.max()) + 1}")
    if split == "train" and few_shot > 0:
        keep = _first_per_label(y, few_shot)
        x, y = x[keep], y[keep]
    x_t = torch.as_tensor(np.ascontiguousarray(x, dtype=np.float32))
    if channels_last:
        x_t = x_t.contiguous(memory_format=torch.channels_last)
    return ClientData(x_t.to(device), torch.as_tensor(y.astype(np.int64)).to(device))


def _first_per_label(y: np.ndarray, k: int) -> np.ndarray:
    """Indices of the first ``k`` samples of every label, in file order (PFLlib's few-shot rule)."""
    keep: List[int] = []
    seen: dict = {}
    for i, label in enumerate(y.tolist()):
        if seen.get(label, 0) < k:
            seen[label] = seen.get(label, 0) + 1
            keep.append(i)
    return np.asarray(keep, dtype=np.int64)


def ensure_default_dataset(name: str, num_clients: int, data_dir: Optional[Path] = None,
                           seed: int = 1) -> Optional[Path]:
    """Build the embedded Digits dataset on first use; other datasets are never built implicitly."""
    root = Path(data_dir or DATASET_DIR) / name
    if name != "Digits" or root.exists():
        return None
    from dataset.generate_Digits import DIGITS_MIN_SAMPLES, load_raw
    from dataset.utils.generate import PartitionOptions, build_dataset
    options = PartitionOptions(num_clients=num_clients, seed=seed, min_samples=DIGITS_MIN_SAMPLES)
    x, y = load_raw()
    build_dataset(root, x, y, options, source="Digits")
    return root

