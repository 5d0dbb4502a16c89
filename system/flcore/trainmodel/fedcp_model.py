"""FedCP's model: the head-split model plus a global head and the Conditional Policy Network (CPN),
as one module so that everything FedCP shares lives in ``client.model``.

(Zhang et al., "FedCP: Separating Feature Information for Personalized Federated Learning via
Conditional Policy", KDD 2023.)

Names: ``base``, ``global_head`` and ``policy`` are shared, ``head`` is the personal head. For
features ``z``, the CPN reads ``z * v`` (``v``: the client's context, the L2-normalised sum of the
personal head's class weight vectors) and produces, per feature, a two-way soft choice
``(r, s)`` with ``r + s = 1``; the prediction is ``head(z * r) + global_head(z * s)``. The global head
takes no gradient during local training (it only changes through the upload and the average).
"""
from __future__ import annotations

import copy
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from flcore.trainmodel.shapes import head_in_features


class ConditionalPolicy(nn.Module):
    """``Linear(D, 2D) -> LayerNorm -> ReLU``, read as two logits per feature."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        self.scores = nn.Sequential(nn.Linear(dim, 2 * dim), nn.LayerNorm(2 * dim), nn.ReLU())

    def forward(self, gate_input: torch.Tensor, gumbel_noise: Optional[torch.Tensor] = None,
                temperature: float = 1.0) -> Tuple[torch.Tensor, torch.Tensor]:
        """(personal share r, global share s), each (B, D), summing to 1.

        With ``gumbel_noise`` (shape (B, 2, D)) this is the Gumbel-softmax relaxation used in
        training; without it, the plain softmax of the scores (deterministic evaluation).
        """
        logits = self.scores(gate_input).view(-1, 2, self.dim)
        if gumbel_noise is not None:
            logits = logits + gumbel_noise
        shares = torch.softmax(logits / temperature, dim=1)
        return shares[:, 0], shares[:, 1]


def gumbel_noise(shape: Tuple[int, ...], generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Standard Gumbel samples ``-log(-log U)`` drawn from ``generator`` (a CPU generator)."""
    uniform = torch.rand(shape, generator=generator).clamp_(min=torch.finfo(torch.float32).tiny)
    return (-torch.log(-torch.log(uniform))).to(device)


def rbf_mmd(x: torch.Tensor, y: torch.Tensor, bandwidths: Tuple[float, ...] = (10.0, 15.0, 20.0, 50.0)) -> torch.Tensor:
    """Biased squared MMD between the rows of ``x`` and ``y`` with a sum of RBF kernels
    ``exp(-d^2 / (2a))`` over ``bandwidths`` (the kernel and bandwidths of the authors' code)."""
    def squared_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a_sq = (a * a).sum(dim=1, keepdim=True)
        b_sq = (b * b).sum(dim=1, keepdim=True)
        return (a_sq + b_sq.T - 2.0 * (a @ b.T)).clamp_min(0.0)

    def kernel(d2: torch.Tensor) -> torch.Tensor:
        return sum(torch.exp(-0.5 * d2 / a) for a in bandwidths)
    return (kernel(squared_distances(x, x)) + kernel(squared_distances(y, y))
            - 2.0 * kernel(squared_distances(x, y))).mean()


class FedCPModel(nn.Module):
    """``head(z * r) + global_head(z * s)`` with ``(r, s) = policy(z * context)``."""

    def __init__(self, base: nn.Module, head: nn.Module):
        super().__init__()
        dim = head_in_features(head)
        self.base = base
        self.head = head
        self.global_head = copy.deepcopy(head).requires_grad_(False)
        self.policy = ConditionalPolicy(dim)

    def context(self) -> torch.Tensor:
        """The client-specific context: the normalised sum of the personal head's class weights."""
        return F.normalize(self.head.weight.detach().sum(dim=0), dim=0)

    def predict(self, features: torch.Tensor, context: torch.Tensor,
                gumbel: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """(logits, personal share r) for the base's ``features``."""
        personal_share, global_share = self.policy(features * context, gumbel)
        logits = self.head(features * personal_share) + self.global_head(features * global_share)
        return logits, personal_share

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.predict(self.base(x), self.context())[0]
