"""Label-based partitioners: which sample goes to which client.

Every function here is a pure function of a label array and a NumPy ``Generator``: it returns one
index array per client, and every sample index appears in exactly one client's array (or the
function raises ``PartitionError``). The schemes follow PFLlib's ``separate_data``:

* ``pat``   - pathological: each client holds at most ``class_per_client`` classes;
* ``iid``   - ``pat`` with every class allowed (PFLlib's definition of IID);
* ``dir``   - Dirichlet label skew with concentration ``alpha``;
* ``exdir`` - Extended Dirichlet (arXiv 2311.03154): each client first draws ``class_per_client``
  labels, then a Dirichlet split is made among the clients holding each label.

Unlike PFLlib, the Dirichlet loops are bounded: when no acceptable draw is found after
``max_tries`` attempts the error names the parameters to change (PFLlib issue #130).
"""
from __future__ import annotations

import math
from typing import List

import numpy as np

PARTITIONS = ("iid", "pat", "dir", "exdir")
TRAIN_RATIO = 0.75
# PFLlib's module constant; it only enters the minimum client size below.
PFLLIB_BATCH_SIZE = 10


class PartitionError(ValueError):
    """The requested partition cannot be built; the message says which parameter to change."""


def least_samples(num_samples: int, num_clients: int) -> int:
    """PFLlib's minimum client size: enough for one test batch, capped at half a fair share."""
    return int(min(PFLLIB_BATCH_SIZE / (1 - TRAIN_RATIO), num_samples / num_clients / 2))


def partition(labels: np.ndarray, num_clients: int, scheme: str, rng: np.random.Generator, *,
              num_classes: int, class_per_client: int = 2, alpha: float = 0.1,
              balance: bool = False, min_samples: int | None = None,
              max_tries: int = 1000) -> List[np.ndarray]:
    """Dispatch to one scheme; returns ``num_clients`` int64 index arrays into ``labels``.

    ``min_samples`` is the smallest client a Dirichlet scheme may produce (default: PFLlib's
    :func:`least_samples` for ``dir``, 10 for ``exdir``).
    """
    if num_clients < 1:
        raise PartitionError(f"--num-clients must be >= 1, got {num_clients}")
    if len(labels) < num_clients:
        raise PartitionError(f"{len(labels)} samples cannot be split over {num_clients} clients; "
                             f"lower --num-clients")
    if scheme == "iid":
        return partition_pat(labels, num_clients, num_classes, num_classes, balance, rng)
    if scheme == "pat":
        return partition_pat(labels, num_clients, num_classes, class_per_client, balance, rng)
    if scheme == "dir":
        return partition_dir(labels, num_clients, num_classes, alpha, rng, min_size=min_samples,
                             max_tries=max_tries)
    if scheme == "exdir":
        return partition_exdir(labels, num_clients, num_classes, class_per_client, alpha, rng,
                               max_tries=max_tries, min_size=10 if min_samples is None else min_samples)
    raise PartitionError(f"unknown partition {scheme!r}; choose one of {', '.join(PARTITIONS)}")


def partition_pat(labels: np.ndarray, num_clients: int, num_classes: int, class_per_client: int,
                  balance: bool, rng: np.random.Generator) -> List[np.ndarray]:
    """Pathological split: each client receives contiguous chunks of at most ``class_per_client`` classes.

    Classes are visited in order; each is cut among the first ``ceil(N*C/K)`` clients that still
    have class budget. Balanced chunks are equal (the last takes the remainder); unbalanced chunk
    sizes are drawn uniformly, as PFLlib does.
    """
    if not 1 <= class_per_client <= num_classes:
        raise PartitionError(f"--class-per-client must be in [1, {num_classes}], got {class_per_client}")
    budget = np.full(num_clients, class_per_client)
    clients_per_class = math.ceil(num_clients * class_per_client / num_classes)
    floor = least_samples(len(labels), num_clients) / num_classes
    assigned: List[List[np.ndarray]] = [[] for _ in range(num_clients)]
    for k in range(num_classes):
        idx_k = np.flatnonzero(labels == k)
        if len(idx_k) == 0:
            continue
        receivers = np.flatnonzero(budget > 0)[:clients_per_class]
        if len(receivers) == 0:
            raise PartitionError(
                f"class {k} has no client left to receive it: num_clients * class_per_client "
                f"({num_clients} * {class_per_client}) is too small for {num_classes} classes; "
                f"raise --num-clients or --class-per-client")
        sizes = _chunk_sizes(len(idx_k), len(receivers), balance, floor, rng)
        for client, chunk in zip(receivers, np.split(idx_k, np.cumsum(sizes)[:-1])):
            assigned[client].append(chunk)
        budget[receivers] -= 1
    return [_concat(chunks) for chunks in assigned]


def _chunk_sizes(n: int, parts: int, balance: bool, floor: float,
                 rng: np.random.Generator) -> np.ndarray:
    """Sizes of ``parts`` chunks summing to ``n``; unbalanced sizes are uniform in [lo, n/parts)."""
    share = n / parts
    if balance or parts == 1:
        sizes = np.full(parts, n // parts)
    else:
        low = int(max(share / 10, floor))
        high = max(int(share), low + 1)
        sizes = rng.integers(low, high, size=parts)
        # Keep the cut valid when the draws overshoot a small class.
        while sizes[:-1].sum() > n:
            sizes[:-1] //= 2
    sizes[-1] = n - sizes[:-1].sum()
    return sizes


def partition_dir(labels: np.ndarray, num_clients: int, num_classes: int, alpha: float,
                  rng: np.random.Generator, *, min_size: int | None = None,
                  max_tries: int = 1000) -> List[np.ndarray]:
    """Dirichlet label skew: for each class, client shares ~ Dir(alpha * 1).

    Clients already holding a fair share (``len(labels) / num_clients``) receive no more. The draw
    is repeated until every client holds ``min_size`` samples (PFLlib's ``least_samples`` by
    default), at most ``max_tries`` times.
    """
    _check_alpha(alpha)
    need = least_samples(len(labels), num_clients) if min_size is None else min_size
    fair_share = len(labels) / num_clients
    holders = np.ones((num_classes, num_clients), dtype=bool)
    for _ in range(max_tries):
        parts = _dirichlet_draw(labels, num_clients, num_classes, alpha, holders, fair_share, rng)
        if min(len(p) for p in parts) >= need:
            return parts
    raise PartitionError(
        f"no Dirichlet draw gave every client >= {need} samples in {max_tries} tries "
        f"(alpha={alpha}, num_clients={num_clients}, {len(labels)} samples); raise --alpha, "
        f"lower --num-clients or lower --min-samples")


def partition_exdir(labels: np.ndarray, num_clients: int, num_classes: int, class_per_client: int,
                    alpha: float, rng: np.random.Generator, *, max_tries: int = 1000,
                    min_size: int = 10) -> List[np.ndarray]:
    """Extended Dirichlet: a label set per client, then a Dirichlet split per label among its holders."""
    _check_alpha(alpha)
    if not 1 <= class_per_client <= num_classes:
        raise PartitionError(f"--class-per-client must be in [1, {num_classes}], got {class_per_client}")
    min_holders = max(class_per_client * num_clients // num_classes // 2, 1)
    for _ in range(max_tries):
        holders = np.zeros((num_classes, num_clients), dtype=bool)
        for client in range(num_clients):
            holders[rng.choice(num_classes, class_per_client, replace=False), client] = True
        if holders.sum(axis=1).min() >= min_holders:
            break
    else:
        raise PartitionError(
            f"could not give every label >= {min_holders} holders in {max_tries} tries "
            f"(num_clients={num_clients}, class_per_client={class_per_client}); raise "
            f"--num-clients or --class-per-client")
    fair_share = len(labels) / num_clients
    for _ in range(max_tries):
        parts = _dirichlet_draw(labels, num_clients, num_classes, alpha, holders, fair_share, rng)
        if min(len(p) for p in parts) >= min_size:
            return [rng.permutation(p) for p in parts]
    raise PartitionError(
        f"no Extended-Dirichlet draw gave every client >= {min_size} samples in {max_tries} tries "
        f"(alpha={alpha}, num_clients={num_clients}, class_per_client={class_per_client}); raise "
        f"--alpha or --class-per-client, or lower --num-clients")


def _dirichlet_draw(labels: np.ndarray, num_clients: int, num_classes: int, alpha: float,
                    holders: np.ndarray, fair_share: float,
                    rng: np.random.Generator) -> List[np.ndarray]:
    """One Dirichlet split; ``holders[k, j]`` says whether client j may receive class k."""
    assigned: List[List[np.ndarray]] = [[] for _ in range(num_clients)]
    sizes = np.zeros(num_clients)
    for k in range(num_classes):
        idx_k = rng.permutation(np.flatnonzero(labels == k))
        if len(idx_k) == 0:
            continue
        shares = rng.dirichlet(np.full(num_clients, alpha)) * holders[k] * (sizes < fair_share)
        if shares.sum() <= 0:
            # Every eligible client is full: the last holder takes the class (PFLlib's remainder rule).
            shares = np.zeros(num_clients)
            shares[np.flatnonzero(holders[k])[-1]] = 1.0
        cuts = (np.cumsum(shares / shares.sum()) * len(idx_k)).astype(int)[:-1]
        for client, chunk in enumerate(np.split(idx_k, cuts)):
            assigned[client].append(chunk)
            sizes[client] += len(chunk)
    return [_concat(chunks) for chunks in assigned]


def split_train_test(indices: np.ndarray, rng: np.random.Generator,
                     train_ratio: float = TRAIN_RATIO) -> tuple[np.ndarray, np.ndarray]:
    """Shuffle one client's indices and cut them ``train_ratio`` : ``1 - train_ratio``."""
    shuffled = rng.permutation(indices)
    n_train = int(train_ratio * len(shuffled))
    return shuffled[:n_train], shuffled[n_train:]


def _check_alpha(alpha: float) -> None:
    if not alpha > 0 or not math.isfinite(alpha):
        raise PartitionError(f"--alpha must be a positive number, got {alpha}")


def _concat(chunks: List[np.ndarray]) -> np.ndarray:
    return np.concatenate(chunks).astype(np.int64) if chunks else np.zeros(0, dtype=np.int64)
