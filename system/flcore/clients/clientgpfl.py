"""GPFL's client (Zhang et al., "GPFL: Simultaneously Learning Global and Personalized Feature
Information for Personalized Federated Learning", ICCV 2023).

``client.model`` is a :class:`GPFLModel`. Shared: ``base``, ``gce`` and ``cov``; personal: ``head``.
Per minibatch, with ``z = base(x)``, ``z_P = CoV(z, p)`` and ``z_G = CoV(z, g)``::

    loss = CE(head(z_P), y) + CE(cos(z_G, E), y) + lam * mean_i ||z_G,i - E0[y_i]||_2

where ``E`` are the live class embeddings, ``E0`` the embeddings received this round (constants),
and ``g`` / ``p`` the uniform and label-weighted means of ``E0``. ``-mu`` is SGD weight decay on the
GCE and CoV parameters only.
"""
from __future__ import annotations

from typing import Iterable, Optional, Tuple

import torch

from flcore.vmapped.support import Refused
from flcore.clients.clientbase import Client
from flcore.hyperparameters import GPFLParams
from flcore.training.label_counts import class_proportions
from flcore.trainmodel.gpfl_model import conditional_inputs


def magnitude_loss(global_features: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The paper's magnitude-level guidance: the mean over samples of ``||z_G - e_y||_2``."""
    return torch.linalg.vector_norm(global_features - targets, dim=1).mean()


class clientGPFL(Client):
    batched = Refused("its optimiser applies weight decay to some parameter groups (not plain SGD)")

    hparams: GPFLParams

    def setup(self) -> None:
        self.lamda = self.hparams.guidance_weight
        self.model.class_weights = class_proportions(self.train_data.y, self.num_classes)
        # This round's received embeddings and the two conditions made from them (rebuilt every round).
        self.received_embeddings: Optional[torch.Tensor] = None
        self.round_conditions: Optional[Tuple[torch.Tensor, torch.Tensor]] = None

    def shares(self, name: str) -> bool:
        return not name.startswith("head.")

    def make_optimizer(self, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        """SGD with ``-mu`` weight decay on the GCE and CoV (PFLlib's two extra optimisers) only."""
        regularised = {id(p) for module in (self.model.gce, self.model.cov) for p in module.parameters()}
        params = list(params)
        decay = self.hparams.weight_decay  # read here: the base constructor asks for the optimiser first
        groups = [{"params": [p for p in params if id(p) not in regularised], "weight_decay": 0.0},
                  {"params": [p for p in params if id(p) in regularised], "weight_decay": decay}]
        return torch.optim.SGD([g for g in groups if g["params"]], lr=self.learning_rate)

    def begin_local_training(self) -> None:
        self.received_embeddings = self.model.gce.weight.detach().clone()
        self.round_conditions = conditional_inputs(self.received_embeddings, self.model.class_weights)

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        generic, personal = self.round_conditions
        features = self.model.base(x)
        personal_features = self.model.cov(features, personal)
        global_features = self.model.cov(features, generic)
        loss = self.loss(self.model.head(personal_features), y)
        loss = loss + self.model.gce.angular_loss(global_features, y)
        if self.lamda:
            loss = loss + self.lamda * magnitude_loss(global_features, self.received_embeddings[y])
        return loss
