"""Per-class vectors exchanged instead of parameters: FedProto's prototypes and FD's mean logits.

A client summarises its data by one vector per class it holds (a mean feature, or a mean logit).
The server averages each class over the clients that hold it, each client counting once (FedProto's
global prototypes, FD's global average logits), and sends the averages back. Classes that no uploading client
holds are absent from the average. These are pure functions and a small accumulator; the per-class
sums are one-hot matrix products (one per batch, deterministic on GPUs too, unlike ``index_add_``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import nn


@dataclass(frozen=True)
class ClassVectors:
    """One vector per class: ``vectors`` (C, D), ``present`` (C,) bool; absent rows are zero."""
    vectors: torch.Tensor
    present: torch.Tensor


class ClassMeanAccumulator:
    """Running per-class sums and counts of (B, D) vectors, kept in float64."""

    def __init__(self, num_classes: int, dim: Optional[int] = None, device: Optional[torch.device] = None):
        self.num_classes = num_classes
        # Let means() answer "no class present" (rather than fail) when nothing was added.
        self.dim, self.device = dim, device
        self.sums: Optional[torch.Tensor] = None
        self.counts: Optional[torch.Tensor] = None

    @torch.no_grad()
    def add(self, vectors: torch.Tensor, labels: torch.Tensor) -> None:
        onehot = nn.functional.one_hot(labels, self.num_classes).double()  # (B, C)
        sums, counts = onehot.T @ vectors.detach().double(), onehot.sum(0)
        if self.sums is None:
            self.sums, self.counts = sums, counts
        else:
            self.sums += sums
            self.counts += counts

    def means(self, dtype: torch.dtype = torch.float32) -> ClassVectors:
        if self.sums is None:
            if self.dim is None:
                raise ValueError("no vectors were added")
            return ClassVectors(torch.zeros(self.num_classes, self.dim, dtype=dtype, device=self.device),
                                torch.zeros(self.num_classes, dtype=torch.bool, device=self.device))
        means = self.sums / self.counts.clamp(min=1).unsqueeze(1)
        return ClassVectors(means.to(dtype), self.counts > 0)


def average_over_holders(uploads: Sequence[ClassVectors]) -> ClassVectors:
    """Per class, the unweighted mean of the uploads that hold the class (each client counts once)."""
    if not uploads:
        raise ValueError("average_over_holders needs at least one upload")
    held = torch.stack([u.present for u in uploads]).double()          # (n, C)
    stacked = torch.stack([u.vectors.double() for u in uploads])       # (n, C, D)
    holders = held.sum(0)                                               # (C,)
    mean = (held.unsqueeze(2) * stacked).sum(0) / holders.clamp(min=1).unsqueeze(1)
    return ClassVectors(mean.to(uploads[0].vectors.dtype), holders > 0)
