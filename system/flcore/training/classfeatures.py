"""Per-class feature statistics of a feature extractor on one client's data (class prototypes).

Used by FedGH (prototypes train the server's head), FedPAC (prototypes for feature alignment, and
the class priors, means and variances of its classifier-combination QP) and FedAS (local prototypes
that the received global body is aligned to). One pass over the data, vectorised: features are
pooled per class with a one-hot matrix product (deterministic on GPUs too, unlike ``index_add_``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Tuple

import torch
from torch import nn

from utils.client_data import ClientData
STATS_BATCH_SIZE = 256


@dataclass(frozen=True)
class ClassFeatureStats:
    """Sufficient statistics of the features ``z`` of each class ``k`` (float64)."""
    counts: torch.Tensor        # (C,) number of samples of class k
    sums: torch.Tensor          # (C, D) sum of z over class k
    sq_norm_sums: torch.Tensor  # (C,) sum of ||z||^2 over class k

    @property
    def present(self) -> torch.Tensor:
        return self.counts > 0

    def means(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Class prototypes (C, D); rows of absent classes are zero."""
        return (self.sums / self.counts.clamp(min=1).unsqueeze(1)).to(dtype)


@torch.no_grad()
def class_feature_stats(base: nn.Module, data: ClientData, num_classes: int,
                        batch_size: int = STATS_BATCH_SIZE) -> ClassFeatureStats:
    """Statistics of ``base(x)`` per label over all of ``data``, with ``base`` in eval mode."""
    was_training = base.training
    base.eval()
    counts = sums = sq_norm_sums = None
    try:
        for x, y in data.eval_batches(batch_size):
            features = base(x).double()
            onehot = nn.functional.one_hot(y, num_classes).double()  # (B, C)
            batch = (onehot.sum(0), onehot.T @ features, onehot.T @ (features * features).sum(1))
            if counts is None:
                counts, sums, sq_norm_sums = batch
            else:
                counts, sums, sq_norm_sums = counts + batch[0], sums + batch[1], sq_norm_sums + batch[2]
    finally:
        base.train(was_training)
    if counts is None:
        raise ValueError("class_feature_stats needs at least one sample")
    return ClassFeatureStats(counts, sums, sq_norm_sums)


def pooled_prototypes(prototypes: Sequence[torch.Tensor],
                      counts: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Global prototype of each class: the sample-count-weighted mean of the clients' prototypes.

    Returns ``(prototypes (C, D), present (C,) bool)``; classes no client holds stay zero and absent.
    """
    weights = torch.stack([c.double() for c in counts])        # (n, C)
    stacked = torch.stack([p.double() for p in prototypes])    # (n, C, D)
    total = weights.sum(0)                                      # (C,)
    pooled = (weights.unsqueeze(2) * stacked).sum(0) / total.clamp(min=1).unsqueeze(1)
    return pooled.to(prototypes[0].dtype), total > 0
