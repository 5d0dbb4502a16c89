"""The pure maths of clustered federated learning (IFCA, CFL): functions of tensors and arrays only.

* :func:`lowest_loss` - which of several cluster models fits a client (IFCA's cluster estimate);
* :func:`group_averages` - each cluster's sample-weighted average of its own uploads;
* :func:`update_gram` and what is read from it - CFL's update norms and cosine similarities;
* :class:`RelativeSplitRule` and :class:`SplitRule` - CFL's tests of whether a cluster has reached a point
  it should split at (scale-free, the default; the authors' absolute bounds);
* :func:`bipartition` - CFL's split of a cluster's clients in two.

The servers (``servers/serverifca.py``, ``servers/servercfl.py``) only wire these.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from flcore.aggregation import State, sample_weights, weighted_average

# CFL bipartitions a cluster only on the updates of at least this many clients (the authors' code: > 2).
MIN_SPLIT_UPLOADS = 3


def lowest_loss(losses: Sequence[float]) -> int:
    """Index of the smallest loss, ties to the lower index; a NaN counts as larger than any number
    (a diverged cluster model is never preferred to one that computes)."""
    if len(losses) == 0:
        raise ValueError("lowest_loss needs at least one loss")
    values = np.asarray(losses, dtype=np.float64)
    return int(np.argmin(np.where(np.isnan(values), np.inf, values)))


def group_averages(states: Sequence[Mapping[str, torch.Tensor]], groups: Sequence[int],
                   num_samples: Sequence[int]) -> Dict[int, State]:
    """``{g: sample-weighted average of the states labelled g}`` for every label in ``groups``, in
    ascending label order; each state weighs ``num_samples[i] / (samples of its group)``."""
    if not len(states) == len(groups) == len(num_samples):
        raise ValueError(f"{len(states)} states, {len(groups)} labels and {len(num_samples)} sample counts")
    averages: Dict[int, State] = {}
    for label in sorted(set(groups)):
        members = [i for i, g in enumerate(groups) if g == label]
        averages[label] = weighted_average([states[i] for i in members],
                                           sample_weights([num_samples[i] for i in members]))
    return averages


def update_gram(states: Sequence[Mapping[str, torch.Tensor]], start: Mapping[str, torch.Tensor],
                names: Sequence[str]) -> torch.Tensor:
    """``G[i, j] = <dW_i, dW_j>`` (float64, n x n) for the updates ``dW_i = states[i] - start`` over the
    tensors ``names``.

    Accumulated tensor by tensor, so no client's whole update is ever flattened into one vector: memory
    holds n copies of the largest tensor, not n copies of the model.
    """
    n = len(states)
    gram = torch.zeros(n, n, dtype=torch.float64, device=start[names[0]].device if names else None)
    for name in names:
        rows = torch.stack([(s[name].detach() - start[name].detach()).reshape(-1) for s in states]).double()
        gram += rows @ rows.T
    return gram


def mean_update_norm(gram: torch.Tensor, weights: Sequence[float]) -> float:
    """``||sum_i w_i dW_i||``, from the Gram matrix of the ``dW_i``: ``sqrt(w^T G w)``."""
    w = torch.as_tensor(list(weights), dtype=torch.float64, device=gram.device)
    return math.sqrt(max(float(w @ gram @ w), 0.0))


def max_update_norm(gram: torch.Tensor) -> float:
    """``max_i ||dW_i||``: the square root of the Gram matrix's largest diagonal entry."""
    return math.sqrt(max(float(gram.diagonal().max()), 0.0))


def effective_uploads(num_samples: Sequence[int]) -> float:
    """``(sum_i n_i)^2 / sum_i n_i^2``: how many uploads the sample-weighted mean amounts to (Kish's effective
    sample size): the count for equal sample counts, near 1 where one client holds most of the samples."""
    counts = np.asarray(num_samples, dtype=np.float64)
    squares = float((counts * counts).sum())
    return float(counts.sum()) ** 2 / squares if squares > 0 else 0.0


def orthogonal_update_norm(gram: torch.Tensor, weights: Sequence[float]) -> float:
    """``sqrt(sum_i w_i^2 ||dW_i||^2)``: the norm the mean update ``sum_i w_i dW_i`` would have, were the
    updates mutually orthogonal (what independent updates come close to in many dimensions)."""
    w = torch.as_tensor(list(weights), dtype=torch.float64, device=gram.device)
    return math.sqrt(max(float((w * w * gram.diagonal()).sum()), 0.0))


def cosine_matrix(gram: torch.Tensor) -> np.ndarray:
    """Cosine similarities of the updates (n x n, float64) from their Gram matrix; an update of norm
    zero has similarity 0 with every other one (and 1 with itself)."""
    norms = gram.diagonal().clamp(min=0).sqrt()
    outer = norms[:, None] * norms[None, :]
    cosines = torch.where(outer > 0, gram / torch.where(outer > 0, outer, torch.ones_like(outer)),
                          torch.zeros_like(gram))
    cosines = cosines.clamp(-1.0, 1.0)
    cosines.fill_diagonal_(1.0)
    return cosines.cpu().numpy()


@dataclass(frozen=True)
class SplitRule:
    """When CFL splits a cluster (Sattler et al., section IV): its clients have jointly reached a
    stationary point of the cluster's objective (the norm of the mean update is below ``eps1``) that
    is not one for each of them (some client's update norm is above ``eps2``), on the updates of at
    least :data:`MIN_SPLIT_UPLOADS` clients, and not in the first ``warmup`` rounds (0-based rounds
    ``< warmup``). Both bounds are absolute: they hold for one model, learning rate and number of local
    steps. The last two arguments of :meth:`due` are :class:`RelativeSplitRule`'s, not read here."""
    eps1: float
    eps2: float
    warmup: int

    def due(self, rnd: int, uploads: int, mean_norm: float, max_norm: float,
            orthogonal_norm: Optional[float] = None, effective: Optional[float] = None) -> bool:
        return (rnd >= self.warmup and uploads >= MIN_SPLIT_UPLOADS
                and mean_norm < self.eps1 and max_norm > self.eps2)


@dataclass(frozen=True)
class RelativeSplitRule:
    """:class:`SplitRule` with its two bounds made relative to the clients' own updates: split when the
    mean update is shorter than ``ratio`` times :func:`orthogonal_update_norm`, the length it would have
    were the updates orthogonal, on at least :data:`MIN_SPLIT_UPLOADS` :func:`effective_uploads`, and not
    in the first ``warmup`` rounds.

    Updates that agree make a longer mean than orthogonal ones, independent ones one about as long (the
    ratio stays near 1 whatever the number of uploads), and only updates that cancel a shorter one: the
    clients together have little left to move (``eps1``'s stationary point) while each still moves on
    its own (``eps2``'s). Multiplying every update by a constant (to first order what another learning rate
    or scale of the weights does) changes neither the ratio nor the decision. Effective uploads, not the
    count: where one client holds most of the samples, the mean is that client's update and its comparison
    with the updates says nothing about the others. All updates zero: no split. ``uploads`` and
    ``max_norm`` are :class:`SplitRule`'s, not read.
    """
    ratio: float
    warmup: int

    def due(self, rnd: int, uploads: int, mean_norm: float, max_norm: float, orthogonal_norm: float,
            effective: float) -> bool:
        return (rnd >= self.warmup and effective >= MIN_SPLIT_UPLOADS and orthogonal_norm > 0
                and mean_norm < self.ratio * orthogonal_norm)


# How agglomerative clustering rates two groups: by the least similar cross pair (complete linkage) or
# by the most similar one (single linkage).
LINKAGES = {"complete": np.minimum, "single": np.maximum}


def bipartition(similarity: np.ndarray, linkage: str = "complete") -> Tuple[List[int], List[int]]:
    """Split the clients of an ``n x n`` similarity matrix (n >= 2) in two: the two groups agglomerative
    clustering leaves at the end, merging at each step the two groups of highest group similarity.

    ``complete`` (the authors' code): a group pair is as similar as its least similar cross pair, which
    keeps the parts compact. ``single``: as its most similar cross pair; that is exactly Sattler et al.'s
    optimal bipartition, the one of smallest largest cross-part similarity (the last edge a maximum
    spanning tree adds), but it may cut off one outlying client alone. Ties go to the lower indices,
    so the result is deterministic. Returns both parts sorted, the one holding index 0 first.
    """
    matrix = np.asarray(similarity, dtype=np.float64)
    n = len(matrix)
    if matrix.shape != (n, n) or n < 2:
        raise ValueError(f"a bipartition needs a square similarity matrix of at least 2 x 2, got {matrix.shape}")
    combine = LINKAGES[linkage]
    groups: List[List[int]] = [[i] for i in range(n)]
    between = matrix.copy()  # between[a, b]: the similarity of groups a and b under the linkage
    np.fill_diagonal(between, -np.inf)
    alive = list(range(n))
    while len(alive) > 2:
        sub = between[np.ix_(alive, alive)]
        # The first maximum in row-major order: the lowest pair (a, b), a < b by symmetry.
        a_pos, b_pos = np.unravel_index(int(np.argmax(sub)), sub.shape)
        a, b = alive[min(a_pos, b_pos)], alive[max(a_pos, b_pos)]
        merged = combine(between[a], between[b])
        between[a, :] = merged
        between[:, a] = merged
        between[a, a] = -np.inf
        groups[a] += groups[b]
        alive.remove(b)
    first, second = sorted(groups[alive[0]]), sorted(groups[alive[1]])
    return (first, second) if first[0] == 0 else (second, first)


def largest_cross_similarity(similarity: np.ndarray, first: Sequence[int], second: Sequence[int]) -> float:
    """``max_{i in first, j in second} similarity[i, j]``: how alike the two parts of a split still are."""
    return float(np.asarray(similarity)[np.ix_(list(first), list(second))].max())
