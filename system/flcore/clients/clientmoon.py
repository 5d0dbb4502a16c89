"""MOON's client (Li, He, Song, "Model-Contrastive Federated Learning", CVPR 2021).

The whole model is shared. Local training adds ``mu * l_con``, a contrastive loss on the features
``z = base(x)``: the received global model's features are the positive, the features of this
client's own model from the end of its previous round are the negative, with temperature ``tau``.
That previous model (only its ``base`` is needed) is the client's persistent state; before the
client's first round it is the initial model (as in PFLlib), which makes the term constant there.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from flcore.aggregation import copy_into, named_tensors
from flcore.vmapped.support import PLAIN
from flcore.hyperparameters import MOONParams
from flcore.training.objective import Objective, Teacher
from flcore.training.received import RECEIVED, ReceivedModelClient, frozen_copy

PREVIOUS_BASE = Teacher("previous_base", part="base")  # this client's base at the end of its last round


def model_contrastive_loss(z: torch.Tensor, z_global: torch.Tensor, z_previous: torch.Tensor,
                           tau: float) -> torch.Tensor:
    """Mean over the batch of ``-log(e^{s_g} / (e^{s_g} + e^{s_p}))``, ``s = cos(z, .) / tau``.

    ``z``, ``z_global``, ``z_previous``: (B, D) features of the same inputs.
    """
    positive = F.cosine_similarity(z, z_global, dim=1) / tau
    negative = F.cosine_similarity(z, z_previous, dim=1) / tau
    # -log(e^p / (e^p + e^n)) = log(1 + e^(n - p)), in its overflow-free form.
    return F.softplus(negative - positive).mean()


@dataclass(frozen=True)
class ModelContrastive(Objective):
    """``CE(head(z), y) + mu * l_con(z, z_received, z_previous)`` with ``z = base(x)`` (B, D); both
    teachers' bases run in eval mode. Cross-entropy alone when ``mu`` is 0."""
    mu: float
    tau: float

    def inputs(self):
        return (RECEIVED, PREVIOUS_BASE) if self.mu else ()

    def __call__(self, model, x, y):
        z = model(x, part="base")
        loss = F.cross_entropy(model(z, part="head"), y)
        if self.mu == 0:  # FedAvg exactly, without the two extra forward passes
            return loss
        z_global = model.teacher(RECEIVED, x, part="base")
        z_previous = model.teacher(PREVIOUS_BASE, x)
        return loss + self.mu * model_contrastive_loss(z, z_global, z_previous, self.tau)


class clientMOON(ReceivedModelClient):
    batched = PLAIN
    persistent_attrs = ("previous_base",)

    hparams: MOONParams

    def setup(self) -> None:
        super().setup()
        self.mu = self.hparams.contrastive_weight
        self.tau = self.hparams.temperature
        self.objective = ModelContrastive(self.mu, self.tau)
        self.previous_base = frozen_copy(self.model.base)

    def end_local_training(self) -> None:
        copy_into(self.previous_base, named_tensors(self.model.base))
        super().end_local_training()
