"""Feature shift: every client holds the data of one domain (Digit5's MNIST, SVHN, ...), as PFLlib's
Digit5 and DomainNet do; within a domain its samples are split among its clients by a label partition.

Client ``i`` belongs to domain ``i % D``, so the domains' client groups differ in size by at most one,
and a run that uses only the first clients of a dataset (``-nc`` below the dataset's count) still
sees every domain equally. Concept shift (``--label-groups``) applies on top, by the same client ids.
"""
from __future__ import annotations

from typing import List, Mapping, Sequence

import numpy as np

from dataset.utils.generate import PartitionOptions
from dataset.utils.natural import consecutive_parts
from dataset.utils.partition import PartitionError, partition


def client_domains(num_clients: int, domains: Sequence[str]) -> List[str]:
    """Each client's domain: client ``i`` gets ``domains[i % len(domains)]``."""
    if num_clients < len(domains):
        raise PartitionError(f"--num-clients must be at least {len(domains)}, one client per domain "
                             f"({', '.join(domains)}); got {num_clients}")
    return [domains[i % len(domains)] for i in range(num_clients)]


def partition_by_domain(y: np.ndarray, sizes: Mapping[str, int], options: PartitionOptions, num_classes: int,
                        rng: np.random.Generator) -> List[np.ndarray]:
    """Each client's sample indices, for samples stored domain after domain (``sizes`` in that order).

    A domain's samples go to its clients only, split by ``options``' label partition (``iid``, ``pat``,
    ``dir``, ``exdir``); a split that cannot be made names its domain."""
    owners = client_domains(options.num_clients, list(sizes))
    parts: List[np.ndarray] = [np.zeros(0, dtype=np.int64)] * options.num_clients
    for domain, indices in zip(sizes, consecutive_parts(list(sizes.values()))):
        clients = [i for i, owner in enumerate(owners) if owner == domain]
        try:
            split = partition(y[indices], len(clients), options.partition, rng, num_classes=num_classes,
                              class_per_client=options.class_per_client, alpha=options.alpha,
                              balance=options.balance, min_samples=options.min_samples)
        except PartitionError as err:
            raise PartitionError(f"domain {domain} ({len(indices)} samples, {len(clients)} clients): {err}") from None
        for client, chosen in zip(clients, split):
            parts[client] = indices[chosen]
    return parts
