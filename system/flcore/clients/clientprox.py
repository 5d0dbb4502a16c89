"""FedProx's client (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020).

The whole model is shared. Each client minimises its local loss plus the proximal term
``mu/2 * ||w - w_global||^2`` around the model it received, which bounds how far heterogeneous
clients drift in one round. PFLlib folds ``mu * (w - w_global)`` into the gradient inside a custom
optimiser; for plain SGD that is the gradient of this loss term, so the two are the same update.
"""
from __future__ import annotations

import torch

from flcore.hyperparameters import FedProxParams
from flcore.training.received import ReceivedModelClient, squared_distance


class clientProx(ReceivedModelClient):
    hparams: FedProxParams

    def setup(self) -> None:
        super().setup()
        self.mu = self.hparams.prox_weight

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = self.loss(self.model(x), y)
        if self.mu == 0:  # FedAvg exactly, without the extra pass over the parameters
            return loss
        return loss + 0.5 * self.mu * squared_distance(self.model, self.received_model)
