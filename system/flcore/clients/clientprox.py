"""FedProx's client (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020).

The whole model is shared. Each client minimises its local loss plus the proximal term
``mu/2 * ||w - w_global||^2`` around the model it received, which bounds how far heterogeneous
clients drift in one round. PFLlib folds ``mu * (w - w_global)`` into the gradient inside a custom
optimiser; for plain SGD that is the gradient of this loss term, so the two are the same update.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from flcore.vmapped.support import PLAIN
from flcore.hyperparameters import FedProxParams
from flcore.training.objective import Objective, squared_distance
from flcore.training.received import RECEIVED, ReceivedModelClient


@dataclass(frozen=True)
class Proximal(Objective):
    """``CE(model(x), y) + mu/2 * sum_l ||w_l - w_received_l||^2``; cross-entropy alone when ``mu`` is 0."""
    mu: float

    def inputs(self):
        return (RECEIVED,) if self.mu else ()

    def __call__(self, model, x, y):
        loss = F.cross_entropy(model(x), y)
        if self.mu == 0:  # FedAvg exactly, without the extra pass over the parameters
            return loss
        received = model.teacher_parameters(RECEIVED)
        return loss + 0.5 * self.mu * squared_distance(model.named_parameters(), received)


class clientProx(ReceivedModelClient):
    batched = PLAIN

    hparams: FedProxParams

    def setup(self) -> None:
        super().setup()
        self.mu = self.hparams.prox_weight
        self.objective = Proximal(self.mu)
