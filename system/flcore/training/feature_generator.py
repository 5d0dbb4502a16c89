"""FedGen's conditional generator of features, and the ensemble it learns from (Zhu, Hong, Zhou, "Data-Free
Knowledge Distillation for Heterogeneous Federated Learning", ICML 2021).

The generator ``G(eps, y)`` maps noise and a label to a feature vector in the space the classifier head
reads (the output of ``base``), so that the users' heads agree it is of class ``y``. The server trains it
on the ensemble of the round's uploaded heads; clients regularise their head with the features it
generates. The noise is an argument, so whoever calls it draws it from their own generator.
"""
from __future__ import annotations

from typing import Callable, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn


class FeatureGenerator(nn.Module):
    """``Linear(noise + one-hot label -> hidden) - BatchNorm - ReLU - Linear(hidden -> features)``, the
    authors' latent generator."""

    def __init__(self, noise_dim: int, num_classes: int, hidden_dim: int, feature_dim: int):
        super().__init__()
        self.noise_dim = noise_dim
        self.num_classes = num_classes
        self.hidden = nn.Sequential(nn.Linear(noise_dim + num_classes, hidden_dim), nn.BatchNorm1d(hidden_dim),
                                    nn.ReLU())
        self.features = nn.Linear(hidden_dim, feature_dim)

    def forward(self, noise: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Features (B, feature_dim) for ``noise`` (B, noise_dim) and ``labels`` (B,)."""
        onehot = F.one_hot(labels, self.num_classes).to(noise.dtype)
        return self.features(self.hidden(torch.cat([noise, onehot], dim=1)))


def draw_labels_and_noise(distribution: torch.Tensor, count: int, noise_dim: int, rng: torch.Generator,
                          device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """``count`` labels drawn from ``distribution`` (C,) with replacement, and standard normal noise
    (count, noise_dim), from ``rng`` (a CPU generator: the draws do not depend on the device)."""
    labels = torch.multinomial(distribution.detach().double().cpu(), count, replacement=True, generator=rng)
    noise = torch.randn(count, noise_dim, generator=rng)
    return labels.to(device), noise.to(device)


def label_shares(label_counts: torch.Tensor) -> torch.Tensor:
    """(K, C) float: each user's share of every label's samples (its column sums to 1 where some user holds
    the label, to 0 where none does), from the users' label counts (K, C)."""
    counts = label_counts.double()
    return (counts / counts.sum(dim=0, keepdim=True).clamp(min=1)).float()


def ensemble_logits(heads: Sequence[Callable[[torch.Tensor], torch.Tensor]], shares: torch.Tensor,
                    features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The ensemble's logits on ``features`` (B, D): ``sum_k shares[k, y_b] * head_k(features_b)``, each user's
    prediction of a sample weighted by its share of the sample's label ``y_b`` (a head that never saw
    the label has no vote on it)."""
    weights = shares[:, labels]                                               # (K, B)
    return sum(weight.unsqueeze(1) * head(features) for weight, head in zip(weights, heads))


def generator_step(generator: FeatureGenerator, optimizer: torch.optim.Optimizer,
                   heads: Sequence[Callable[[torch.Tensor], torch.Tensor]], shares: torch.Tensor,
                   labels: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """One step of ``optimizer`` on ``CE(ensemble_logits(G(noise, labels)), labels)`` (the heads stay as
    they are); returns the loss before the step (detached)."""
    generator.train()
    loss = F.cross_entropy(ensemble_logits(heads, shares, generator(noise, labels), labels), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()


def generated_features(generator: FeatureGenerator, distribution: torch.Tensor, count: int,
                       rng: torch.Generator, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(labels, features)``: ``count`` labels drawn from ``distribution`` and the frozen ``generator``'s
    features for them, without gradient."""
    labels, noise = draw_labels_and_noise(distribution, count, generator.noise_dim, rng, device)
    with torch.no_grad():
        return labels, generator(noise, labels)
