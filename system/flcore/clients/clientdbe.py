"""FedDBE's client (Zhang et al., "Eliminating Domain Bias for Federated Learning in Representation
Space", NeurIPS 2023).

The whole model is shared. Two additions, both on the base's feature vector ``z``:

* PRBM: a personal learnable vector ``b`` (``feature_bias``, never uploaded) is added before the
  head, ``head(z + b)``, so the client's representation bias lives in ``b`` and not in the base;
* MR: the running mean of ``z`` over the round's minibatches (momentum ``-mo``) is pulled towards
  the global mean fixed at start-up, with weight ``-klw``:
  ``klw * mean(0.5 * (m_t - m_global)^2)``, ``m_t = (1 - mo) m_{t-1} + mo * mean_batch(z)``.
"""
from __future__ import annotations

import copy
from typing import Optional

import torch
from torch import nn

from flcore.vmapped.support import Refused
from flcore.clients.clientbase import Client
from flcore.hyperparameters import FedDBEParams
from flcore.trainmodel.shapes import head_in_features


class FeatureBias(nn.Module):
    """A learnable vector added to every feature vector (PRBM); starts at zero."""

    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features + self.bias


class BiasedHeadModel(nn.Module):
    """FedDBE's prediction: ``head(base(x) + b)``."""

    def __init__(self, model: nn.Module, feature_bias: FeatureBias):
        super().__init__()
        self.model = model
        self.feature_bias = feature_bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.head(self.feature_bias(self.model.base(x)))


def mean_regularizer(running_mean: torch.Tensor, global_mean: torch.Tensor) -> torch.Tensor:
    return torch.mean(0.5 * (running_mean - global_mean) ** 2)


class clientDBE(Client):
    batched = Refused("every step updates a running mean of the features and a personal bias with a second "
                      "optimiser (after_step)")
    persistent_attrs = ("feature_bias", "bias_optimizer")

    hparams: FedDBEParams

    def setup(self) -> None:
        self.momentum = self.hparams.momentum
        self.mean_weight = self.hparams.mean_weight
        dim = head_in_features(self.model.head)
        self.feature_bias = FeatureBias(dim).to(self.train_data.y.device)
        self.bias_optimizer = torch.optim.SGD(self.feature_bias.parameters(), lr=self.learning_rate)
        # Given by the server with every broadcast; the running mean restarts every round.
        self.global_mean: Optional[torch.Tensor] = None
        self.running_mean: Optional[torch.Tensor] = None

    def track_mean(self, features: torch.Tensor) -> torch.Tensor:
        """Advance the running mean by one minibatch; the returned value keeps this batch's graph."""
        previous = torch.zeros_like(features[0]) if self.running_mean is None else self.running_mean
        current = (1 - self.momentum) * previous + self.momentum * features.mean(dim=0)
        # Earlier batches enter the next step as constants (their graphs are already used).
        self.running_mean = current.detach()
        return current

    def begin_local_training(self) -> None:
        self.running_mean = None
        self.feature_bias.train()

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        features = self.model.base(x)
        running_mean = self.track_mean(features)
        loss = self.loss(self.model.head(self.feature_bias(features)), y)
        if self.mean_weight and self.global_mean is not None:
            loss = loss + self.mean_weight * mean_regularizer(running_mean, self.global_mean)
        return loss

    def after_step(self) -> None:
        self.bias_optimizer.step()
        self.bias_optimizer.zero_grad(set_to_none=True)

    def fine_tune(self, epochs: int) -> None:
        """A new client: FedDBE's own local update, which trains the feature bias along with the model."""
        self.model.train()
        self.begin_local_training()
        self.run_epochs(epochs, self.local_loss)

    def evaluation_model(self) -> nn.Module:
        return BiasedHeadModel(self.model, self.feature_bias)

    def initial_feature_mean(self, global_model: nn.Module) -> torch.Tensor:
        """The initialisation period: this client's running feature mean after one local training.

        A private copy of ``global_model`` is trained for ``-ls`` epochs with plain cross-entropy (no
        bias, no regulariser), with this client's own generator and a throw-away optimiser; the copy
        is then dropped. The client's model, optimiser and schedule are untouched, so the only
        trace is the advanced batch-order generator.
        """
        trainee = copy.deepcopy(global_model)
        trainee.train()
        optimizer = self.make_optimizer(trainee.parameters())
        self.running_mean = None

        def plain_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            features = trainee.base(x)
            self.track_mean(features.detach())
            return self.loss(trainee.head(features), y)
        self.run_epochs(self.local_epochs, plain_loss, optimizer)
        mean = self.running_mean
        self.running_mean = None
        if mean is None:  # no local epochs: nothing was seen, as PFLlib's zero-initialised mean
            return torch.zeros(head_in_features(trainee.head), device=self.train_data.y.device)
        return mean
