"""GPFL's model: the head-split model plus the Global Category Embedding layer (GCE) and the
Conditional Valve (CoV), as one module so that everything GPFL shares lives in ``client.model``.

(Zhang et al., "GPFL: Simultaneously Learning Global and Personalized Feature Information for
Personalized Federated Learning", ICCV 2023.)

Names: ``base`` and ``gce`` and ``cov`` are shared, ``head`` is personal. The CoV turns the base's
features ``z`` into ``relu(z * (1 + gamma(c)) + beta(c))`` for a conditional input ``c``: the
generic route uses the mean of the class embeddings, the personalised route their mean weighted by
the client's label distribution.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from flcore.trainmodel.shapes import head_in_features


class GlobalCategoryEmbedding(nn.Module):
    """One embedding per class; the angle-level loss is softmax cross-entropy over cosines."""

    def __init__(self, num_classes: int, dim: int):
        super().__init__()
        self.embedding = nn.Embedding(num_classes, dim)

    @property
    def weight(self) -> torch.Tensor:
        return self.embedding.weight

    def angular_loss(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        cosine = F.normalize(features, dim=1) @ F.normalize(self.weight, dim=1).T
        return F.cross_entropy(cosine, labels)


class ConditionalValve(nn.Module):
    """Feature-wise affine modulation conditioned on one vector: ``relu(z * (1 + gamma) + beta)``."""

    def __init__(self, dim: int):
        super().__init__()
        self.gamma = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.LayerNorm(dim))
        self.beta = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.LayerNorm(dim))

    def forward(self, features: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        return F.relu(features * (1 + self.gamma(condition)) + self.beta(condition))


def conditional_inputs(embeddings: torch.Tensor, class_weights: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(generic, personalised) conditions: the uniform and the label-weighted mean of the embeddings."""
    return embeddings.mean(dim=0), class_weights @ embeddings


class GPFLModel(nn.Module):
    """``head(CoV(base(x), personalised condition))``, with the GCE and CoV as submodules."""

    def __init__(self, base: nn.Module, head: nn.Module, num_classes: int):
        super().__init__()
        dim = head_in_features(head)
        self.base = base
        self.head = head
        self.gce = GlobalCategoryEmbedding(num_classes, dim)
        self.cov = ConditionalValve(dim)
        # The client's label distribution: data, not a parameter (never exchanged); set by the client.
        self.class_weights: Optional[torch.Tensor] = None

    def conditions(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """The conditions from the embeddings as they stand (the received ones, at evaluation time)."""
        embeddings = self.gce.weight.detach()
        weights = self.class_weights
        if weights is None:  # the server's copy has no data: use the uniform distribution
            weights = torch.full((embeddings.shape[0],), 1.0 / embeddings.shape[0], device=embeddings.device)
        return conditional_inputs(embeddings, weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, personal = self.conditions()
        return self.head(self.cov(self.base(x), personal))
