"""MOON's client (Li, He, Song, "Model-Contrastive Federated Learning", CVPR 2021).

The whole model is shared. Local training adds ``mu * l_con``, a contrastive loss on the features
``z = base(x)``: the received global model's features are the positive, the features of this
client's own model from the end of its previous round are the negative, with temperature ``tau``.
That previous model (only its ``base`` is needed) is the client's persistent state; before the
client's first round it is the initial model (as in PFLlib), which makes the term constant there.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from flcore.aggregation import copy_into, named_tensors
from flcore.hyperparameters import MOONParams
from flcore.training.received import ReceivedModelClient, frozen_copy


def model_contrastive_loss(z: torch.Tensor, z_global: torch.Tensor, z_previous: torch.Tensor,
                           tau: float) -> torch.Tensor:
    """Mean over the batch of ``-log(e^{s_g} / (e^{s_g} + e^{s_p}))``, ``s = cos(z, .) / tau``.

    ``z``, ``z_global``, ``z_previous``: (B, D) features of the same inputs.
    """
    positive = F.cosine_similarity(z, z_global, dim=1) / tau
    negative = F.cosine_similarity(z, z_previous, dim=1) / tau
    # -log(e^p / (e^p + e^n)) = log(1 + e^(n - p)), in its overflow-free form.
    return F.softplus(negative - positive).mean()


class clientMOON(ReceivedModelClient):
    persistent_attrs = ("previous_base",)

    hparams: MOONParams

    def setup(self) -> None:
        super().setup()
        self.mu = self.hparams.contrastive_weight
        self.tau = self.hparams.temperature
        self.previous_base = frozen_copy(self.model.base)

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = self.model.base(x)
        loss = self.loss(self.model.head(z), y)
        if self.mu == 0:  # FedAvg exactly, without the two extra forward passes
            return loss
        with torch.no_grad():
            z_global = self.received_model.base(x)
            z_previous = self.previous_base(x)
        return loss + self.mu * model_contrastive_loss(z, z_global, z_previous, self.tau)

    def end_local_training(self) -> None:
        copy_into(self.previous_base, named_tensors(self.model.base))
        super().end_local_training()
