"""FedCross's cross-aggregation, as pure functions of named tensors.

Hu et al., "FedCross: Towards Accurate Federated Learning via Multi-Model Cross-Aggregation" (arXiv
2210.08285): the server keeps K middleware models; after each is trained by a client, model j is fused
with one collaborator c(j): ``m_j <- alpha * m_j + (1 - alpha) * m_c(j)``. The collaborator is the next
model in turn (the offset changing every round), or the least (the paper's choice) or most similar one by
the cosine similarity of the models' parameters.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Sequence

import torch

from flcore.training.personal import interpolate

State = Dict[str, torch.Tensor]

IN_ORDER, LEAST_SIMILAR, MOST_SIMILAR = 0, 1, 2  # PFLlib's -cmss values
NO_COLLABORATOR = -1                             # a model alone (K = 1) is left as it is


def cosine_similarities(models: Sequence[Mapping[str, torch.Tensor]], names: Sequence[str]) -> torch.Tensor:
    """(K, K) cosine similarities of the models' tensors ``names``, each model flattened into one vector."""
    vectors = torch.stack([torch.cat([m[n].detach().reshape(-1).double() for n in names]) for m in models])
    unit = vectors / vectors.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return unit @ unit.T


def collaborators(similarity: torch.Tensor, strategy: int, round_index: int) -> List[int]:
    """Model j's collaborator, never j itself, for each j: ``(j + offset) mod K`` with the offset cycling
    through 1 .. K-1 over the rounds (:data:`IN_ORDER`), or the model of lowest (:data:`LEAST_SIMILAR`) or
    highest (:data:`MOST_SIMILAR`) similarity to j (``similarity``: (K, K); ties to the lower index)."""
    count = similarity.shape[0]
    if count < 2:
        return [NO_COLLABORATOR] * count
    if strategy == IN_ORDER:
        offset = round_index % (count - 1) + 1
        return [(j + offset) % count for j in range(count)]
    if strategy not in (LEAST_SIMILAR, MOST_SIMILAR):
        raise ValueError(f"unknown collaborator strategy {strategy}")
    excluded = torch.eye(count, dtype=torch.bool, device=similarity.device)
    if strategy == LEAST_SIMILAR:
        return similarity.masked_fill(excluded, float("inf")).argmin(dim=1).tolist()
    return similarity.masked_fill(excluded, float("-inf")).argmax(dim=1).tolist()


def cross_aggregate(models: Sequence[Mapping[str, torch.Tensor]], partners: Sequence[int],
                    alpha: float) -> List[State]:
    """``alpha * models[j] + (1 - alpha) * models[partners[j]]`` for each j, all from the models as given
    (integer tensors, counters, from the collaborator); a model without a collaborator is copied."""
    fused = []
    for j, model in enumerate(models):
        partner = partners[j]
        if partner == NO_COLLABORATOR:
            fused.append({name: t.detach().clone() for name, t in model.items()})
        else:
            fused.append(interpolate(model, models[partner], alpha))
    return fused
