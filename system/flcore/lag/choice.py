"""FedLAG's layer-choice rules as pure functions: the evidence a :class:`~.selector.LayerSelector` has
gathered (conflict counts, cosine sums, paired gaps) in, a personal set or a score out.

``top_k_positive`` is the paper's rule (``every_round``, ``warmup``), ``random_layers`` the ``random``
control, and ``evidence_choice`` with ``paired_lead`` and ``mean_cosines`` the ``smoothed`` one;
``conflict_rates`` reads the accumulated rate. No state, no server, no I/O: the selector calls them on its
own tensors, and the tests on hand-made ones. Imports only torch, as the rest of ``lag/``.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import torch

from .conflict import top_k_layers


def top_k_positive(scores: torch.Tensor, k: int) -> Tuple[int, ...]:
    """Indices of the ``k`` highest positive scores, ties to the earlier layer; fewer if fewer are positive."""
    return tuple(i for i in top_k_layers(scores, k) if float(scores[i]) > 0)


def random_layers(num_layers: int, k: int, seed: int) -> Tuple[int, ...]:
    """``k`` of ``num_layers`` layer indices drawn without replacement from a stream seeded by ``seed``
    (a generator of its own: the run's other random streams are untouched), ascending."""
    generator = torch.Generator().manual_seed(int(seed))
    return tuple(sorted(torch.randperm(num_layers, generator=generator)[:max(k, 0)].tolist()))


def conflict_rates(conflicts: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """Conflicting pairs / scored pairs per layer (float64), 0 where no pair was scored."""
    conflicts, pairs = conflicts.double(), pairs.double()
    return torch.where(pairs > 0, conflicts / pairs.clamp(min=1e-300), torch.zeros_like(pairs))


def mean_cosines(cosine_sums: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """Accumulated mean pairwise cosine per layer (float64), +1 (full agreement) where no pair was scored."""
    pairs = pairs.double()
    return torch.where(pairs > 0, cosine_sums.double() / pairs.clamp(min=1e-300), torch.ones_like(pairs))


def paired_lead(gap_sums: torch.Tensor, gap_squares: torch.Tensor, common: torch.Tensor, challenger: int,
                incumbent: int) -> float:
    """How many standard errors the challenger's cosines lie below the incumbent's, pair for pair.

    The mean over the common pairs of ``cos_incumbent - cos_challenger`` over its standard error
    (sample variance / pairs); 0 without common pairs; a lead without spread counts as infinite.
    """
    n = float(common[challenger, incumbent])
    if n <= 0:
        return 0.0
    mean = float(gap_sums[challenger, incumbent]) / n
    variance = max(float(gap_squares[challenger, incumbent]) / n - mean * mean, 0.0)
    if variance <= 0.0:
        return float("inf") if mean > 0 else 0.0
    return mean / (variance / n) ** 0.5


def evidence_choice(means: torch.Tensor, eligible: torch.Tensor, lead, current: Sequence[int], k: int,
                    margin: float, xi: float) -> Tuple[int, ...]:
    """The personal set after one update of the evidence.

    ``means``: each layer's accumulated mean cosine; ``eligible``: the layers with a conflicting pair;
    ``lead(a, b)``: standard errors by which layer a's cosines lie below layer b's. A free place fills at
    once, with the eligible layer nearest the output among those the evidence does not separate from the
    one of lowest mean (its lead over them is at most ``margin``): a difference of one round's noise never
    puts a layer far from the output in place of the head, and a layer far apart by the evidence is still
    taken first. A challenger replaces the incumbent of highest mean only when its own updates conflict on
    average (mean below ``xi``) and its lead over the incumbent exceeds ``margin``: once personal, a
    layer's updates start from each client's own copy and agree more, so a shared layer that merely agrees
    a little less would otherwise win in the end on that drift alone. Ties of the mean rank the earlier
    layer first.
    """
    if k <= 0:
        return ()
    rank = lambda i: (float(means[i]), i)  # noqa: E731 - most opposed first, then the earlier layer
    chosen = [i for i in current if i < len(means)][:k]
    open_layers = lambda: sorted((i for i in range(len(means)) if i not in chosen and bool(eligible[i])),  # noqa: E731
                                 key=rank)
    while len(chosen) < k and open_layers():
        lowest, *others = open_layers()
        chosen.append(max([lowest] + [i for i in others if lead(lowest, i) <= margin]))
    for challenger in open_layers():
        weakest = max(chosen, key=rank)
        if float(means[challenger]) < xi and rank(challenger) < rank(weakest) and lead(challenger, weakest) > margin:
            chosen[chosen.index(weakest)] = challenger
    return tuple(sorted(chosen))
