"""Client data in memory: read from disk once, kept as tensors, batched by index permutations.

PFLlib rebuilds a Python list of per-sample tensors and a DataLoader on every ``train()`` and
``evaluate()`` call; here each client's arrays are read once into two tensors (on the training
device) and a batch is one indexed gather. Images are kept as one-byte codes and decoded per batch
(:mod:`utils.pixel_codes`): a quarter of the float32 memory, and the very same floats in every batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from dataset.utils.client_files import IMAGE_INPUTS, client_file, content_hash, declared_limits
from utils.datasets import DatasetError, DatasetInfo, read_client_file
from utils.dataset_hints import rebuild_command
from utils.input_kinds import file_inputs_problem, inputs_tensor
from utils.paths import display_path
from utils.pixel_codes import image_codes

Batch = Tuple[torch.Tensor, torch.Tensor]


@dataclass
class ClientData:
    """One client's split, on one device: ``y`` (N int64 labels) and ``x``, the inputs as stored in memory:
    the model's inputs themselves (N x C x H x W float32 images, N x L int64 token ids, N x D float32
    vectors), or, with a ``palette``, uint8 codes of images whose values are ``palette[code]``
    (:mod:`utils.pixel_codes`), decoded per batch. Batches are always the model's inputs."""
    x: torch.Tensor
    y: torch.Tensor
    palette: Optional[torch.Tensor] = None  # (at most 256,) float32 when ``x`` holds codes

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def inputs(self, stored: torch.Tensor) -> torch.Tensor:
        """Rows of :attr:`x` (an index or a slice of it) as the model takes them."""
        return stored if self.palette is None else self.palette[stored.long()]

    def rows(self, index) -> "ClientData":
        """The samples at ``index`` (a slice, a boolean mask or positions), stored as these are."""
        return ClientData(self.x[index], self.y[index], self.palette)

    def stored_bytes(self) -> int:
        """Bytes this split holds in memory (inputs as stored, labels, palette)."""
        palette = 0 if self.palette is None else self.palette.numel() * self.palette.element_size()
        return self.x.numel() * self.x.element_size() + self.y.numel() * self.y.element_size() + palette

    def train_batches(self, batch_size: int, generator: torch.Generator) -> Iterator[Batch]:
        """Shuffled minibatches, dropping the last incomplete one (PFLlib's train loader).

        A client smaller than one batch still trains on all of its samples as a single batch.
        """
        n = len(self)
        order = torch.randperm(n, generator=generator).to(self.y.device)
        stop = max(n - batch_size + 1, 1)
        for start in range(0, stop, batch_size):
            index = order[start:start + batch_size]
            yield self.inputs(self.x[index]), self.y[index]

    def eval_batches(self, batch_size: int = 512) -> Iterator[Batch]:
        """Consecutive slices, no shuffling: evaluation order does not matter."""
        for start in range(0, len(self), batch_size):
            yield self.inputs(self.x[start:start + batch_size]), self.y[start:start + batch_size]

    def split_off(self, fraction: float, seed: Sequence[int]) -> Tuple["ClientData", "ClientData"]:
        """``(rest, held out)``: ``round(fraction * N)`` samples drawn by ``seed`` are held out (at least
        one, and at least one is left); both parts keep the file order, so the rest trains as the whole
        would with its samples removed."""
        n = len(self)
        count = min(max(1, round(fraction * n)), n - 1)
        held = np.zeros(n, dtype=bool)
        held[np.random.default_rng(list(seed)).choice(n, size=count, replace=False)] = True
        keep = torch.as_tensor(~held, device=self.y.device)
        return self.rows(keep), self.rows(~keep)


def load_client_data(info: DatasetInfo, client_id: int, split: str, device: torch.device, *,
                     num_classes: int, few_shot: int = 0, channels_last: bool = False) -> ClientData:
    """Read one client's ``train`` or ``test`` file into tensors on ``device``, checking it.

    The file must agree with ``config.json`` (sample count, and content hash where recorded), hold
    inputs of the dataset's kind and shape (finite real images, or integer token ids below its
    vocab_size) and integer labels in ``[0, num_classes)``.
    """
    rebuild = info.rebuild or rebuild_command(info.root, {"num_clients": info.num_clients})
    sizes = info.train_samples if split == "train" else info.test_samples
    limits = declared_limits(sizes[client_id], info.input_shape) if client_id < len(sizes) else None
    x, y = read_client_file(info.root, split, client_id, rebuild, limits)
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
    labels = torch.as_tensor(y.astype(np.int64)).to(device)
    coded = image_codes(x) if info.input_kind == IMAGE_INPUTS else None
    if coded is None:
        return ClientData(inputs_tensor(x, info.input_kind, channels_last).to(device), labels)
    codes, palette = coded
    codes_t = torch.as_tensor(codes)
    if channels_last:  # laid out as the float images would be, so every batch has their strides
        codes_t = codes_t.contiguous(memory_format=torch.channels_last)
    return ClientData(codes_t.to(device), labels, torch.as_tensor(palette.copy()).to(device))


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




def client_splits(info: DatasetInfo, client_id: int, config, model: torch.nn.Module
                  ) -> Tuple[ClientData, ClientData, Optional[ClientData]]:
    """:func:`load_client_splits` with what the run decides: its device, class count, ``-fs`` and
    ``--val_ratio`` (``config``), and the memory layout of ``model``'s convolutions (images are stored
    channels-last for a model that runs channels-last)."""
    channels_last = any(p.dim() == 4 and p.is_contiguous(memory_format=torch.channels_last)
                        and not p.is_contiguous() for p in model.parameters())
    return load_client_splits(info, client_id, torch.device(config.device), num_classes=config.num_classes,
                              few_shot=config.few_shot, channels_last=channels_last, val_ratio=config.val_ratio)
