"""Every client's minibatches for one stage, as ``ClientData.train_batches`` would yield them.

Each epoch draws ``torch.randperm(n, generator=client.generator)``, the same call ``train_batches``
makes, so a client sees the same batches in the same order and its generator ends in the same state.
A client's steps are its epochs one after another; clients hold different numbers of steps (ragged
epochs). Clients are ordered by steps, most first (:func:`order_key`), so the clients still training at
step ``t`` are always a prefix of the group and are trained on slices, never on copies; a client with
no step left is simply not in the slice, so nothing of it changes. A client smaller than one batch
trains on one batch of all its samples, of its own size: within the prefix, clients are split into runs
of equal batch size, each run one vmapped call, so no batch is ever padded and no sample dropped or
repeated.
"""
from __future__ import annotations

from functools import lru_cache
from typing import List, Sequence, Tuple

import torch


def batches_per_epoch(samples: int, batch_size: int) -> int:
    """What ``train_batches`` yields: full batches only, and one batch when the client is smaller."""
    return len(range(0, max(samples - batch_size + 1, 1), batch_size))


def order_key(client) -> Tuple[int, bool, int]:
    """Most batches first; among equal counts, full batches before smaller clients (by size), so each
    step's clients form a prefix made of runs of equal batch size."""
    samples, batch_size = len(client.train_data), client.batch_size
    return (-batches_per_epoch(samples, batch_size), samples < batch_size, samples)


class BatchPlan:
    """``index[t, i, :sizes[i]]``: the samples (rows of the stacked data) of client ``i``'s step ``t``.

    ``clients`` must be in :func:`order_key` order; ``offsets[i]`` is client ``i``'s first row in the
    stacked data. Drawing the plan advances every client's generator by this stage's epochs.
    """

    def __init__(self, clients: Sequence, epochs: int, batch_size: int, offsets: Sequence[int],
                 device: torch.device):
        counts = [len(c.train_data) for c in clients]
        self.sizes: List[int] = [min(batch_size, n) for n in counts]
        per_epoch = [batches_per_epoch(n, batch_size) for n in counts]
        self.steps: List[int] = [epochs * b for b in per_epoch]
        if self.steps != sorted(self.steps, reverse=True):
            raise ValueError("clients must be ordered by their number of steps, most first (order_key)")
        self.num_steps = self.steps[0] if self.steps else 0
        index = torch.zeros((self.num_steps, len(clients), batch_size), dtype=torch.long)
        for i, client in enumerate(clients):
            rows = []
            for _ in range(epochs):
                order = torch.randperm(counts[i], generator=client.generator)
                rows.append(order[:per_epoch[i] * self.sizes[i]].view(per_epoch[i], self.sizes[i]))
            if rows:
                index[:self.steps[i], i, :self.sizes[i]] = torch.cat(rows) + offsets[i]
        self.index = index.to(device)
        # Clients still training at step t: a prefix of the group (steps are sorted).
        self._active = [sum(1 for s in self.steps if s > t) for t in range(self.num_steps)]

    def groups(self, step: int) -> Tuple[Tuple[int, int, int], ...]:
        """``(first, end, batch size)`` of each run of equal batch size among the clients of ``step``."""
        return _runs(tuple(self.sizes[:self._active[step]]))


@lru_cache(maxsize=256)
def _runs(sizes: Tuple[int, ...]) -> Tuple[Tuple[int, int, int], ...]:
    runs, start = [], 0
    for i in range(1, len(sizes) + 1):
        if i == len(sizes) or sizes[i] != sizes[start]:
            runs.append((start, i, sizes[start]))
            start = i
    return tuple(runs)
