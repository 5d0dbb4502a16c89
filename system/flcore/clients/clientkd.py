"""FedKD's client (Wu, Wu, Lyu, Huang, Xie, "Communication-efficient federated learning via knowledge
distillation", Nature Communications 13, 2032, 2022).

``model`` is the mentee: received from the server each round, trained at ``-mlr`` and uploaded.
``private_model`` is the mentor, which never leaves the client (trained at ``-lr``) and is what it reports.
Every minibatch steps both by adaptive mutual distillation, with H = ``base(x)`` the features and
``W_h`` (``hidden_map``, private) a learned linear map of the mentee's features onto the mentor's::

    L_mentor = CE_t + (KL(p_s || p_t) + MSE(H_t, W_h H_s)) / (CE_t + CE_s)
    L_mentee = CE_s + (KL(p_t || p_s) + MSE(H_t, W_h H_s)) / (CE_t + CE_s)

each model reading the other's outputs as fixed targets; ``W_h`` moves with the mentee's loss. The
denominator weighs the distillation down while the models still predict badly; it is a weight, so it is
not differentiated. (PFLlib differentiates every term of both losses through both models, so each model
also receives the other's gradients.)

After local training the mentee's update from the received model is compressed (``lowrank``): each
matrix keeps the fewest singular values holding the round's share T of its energy, which the server
sets each round. The mentee keeps exactly what it sends, so its upload is the server's reconstruction.
PFLlib compresses the parameters themselves; the paper and the authors' code compress the update.
"""
from __future__ import annotations

from typing import List

import torch
import torch.nn.functional as F
from torch import nn

from flcore.aggregation import copy_into
from flcore.hyperparameters import FedKDParams
from flcore.trainmodel.shapes import head_in_features
from flcore.training.lowrank import low_rank_step
from flcore.training.mutual import MutualLearningClient, distillation
from flcore.training.personal import State, parameter_copies, parameter_views
from flcore.vmapped.support import Refused


def adaptive_distillation_loss(mentor_logits: torch.Tensor, mentee_logits: torch.Tensor,
                               mentor_features: torch.Tensor, mapped_mentee_features: torch.Tensor,
                               y: torch.Tensor) -> torch.Tensor:
    """``L_mentor + L_mentee`` (see the module docstring) of one batch: logits (B, C), features (B, D),
    labels (B,)."""
    ce_mentor = F.cross_entropy(mentor_logits, y)
    ce_mentee = F.cross_entropy(mentee_logits, y)
    weight = 1.0 / (ce_mentor + ce_mentee).detach()
    mentor = distillation(mentor_logits, mentee_logits) + F.mse_loss(mentor_features, mapped_mentee_features.detach())
    mentee = distillation(mentee_logits, mentor_logits) + F.mse_loss(mapped_mentee_features, mentor_features.detach())
    return ce_mentor + ce_mentee + weight * (mentor + mentee)


def identity_map(width: int, like: torch.Tensor) -> nn.Linear:
    """``W_h`` as the identity: mentor and mentee have one architecture here, so their features start comparable."""
    hidden_map = nn.Linear(width, width, bias=False).to(device=like.device, dtype=like.dtype)
    with torch.no_grad():
        hidden_map.weight.copy_(torch.eye(width, device=like.device, dtype=like.dtype))
    return hidden_map


class clientKD(MutualLearningClient):
    batched = Refused("it trains a private mentor beside the shared mentee, each distilled from the other's "
                      "outputs every step, and compresses the mentee's update")
    persistent_attrs = ("private_model", "hidden_map")

    hparams: FedKDParams

    def setup(self) -> None:
        weight = self.model.head.weight
        self.hidden_map = identity_map(head_in_features(self.model.head), weight)
        super().setup()
        self.compression_energy = self.hparams.energy_start  # the round's share T, set by the server
        self.received: State = {}
        self.numbers_sent = 0

    def shared_learning_rate(self) -> float:
        return self.hparams.mentee_learning_rate

    def parameter_groups(self) -> List[dict]:
        groups = super().parameter_groups()
        groups[1]["params"] += list(self.hidden_map.parameters())  # W_h learns with the mentee
        return groups

    def begin_local_training(self) -> None:
        super().begin_local_training()
        self.hidden_map.train()
        self.received = parameter_copies(self.model)

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        mentor_features = self.private_model.base(x)
        mentee_features = self.model.base(x)
        return adaptive_distillation_loss(self.private_model.head(mentor_features), self.model.head(mentee_features),
                                          mentor_features, self.hidden_map(mentee_features), y)

    @torch.no_grad()
    def end_local_training(self) -> None:
        """The mentee becomes what the server will rebuild: the received model plus the compressed update."""
        sent, self.numbers_sent = low_rank_step(self.received, parameter_views(self.model), self.compression_energy)
        copy_into(self.model, sent)
        self.received = {}

    def upload_extras(self) -> dict:
        """How many numbers the compressed update took (the server records the share of the dense size)."""
        return {"numbers_sent": int(self.numbers_sent)}
