"""FedPAC's client (Xu, Tong, Huang, "Personalized Federated Learning with Feature Alignment and
Classifier Collaboration", ICLR 2023).

Each round: (1) the feature statistics of the received body are measured (for the server's
classifier-combination QP); (2) the head trains one epoch with the body frozen; (3) the body trains
``-ls`` epochs with the head frozen, on cross-entropy plus ``-lam`` times the MSE between each
sample's feature and the global prototype of its class; (4) the class prototypes of the trained body
are measured for the server. Only the body is exchanged (``shared_path = "base"``).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from flcore.aggregation import named_tensors
from flcore.vmapped.support import Refused
from flcore.clients.clientbase import Client
from flcore.hyperparameters import FedPACParams
from flcore.training.classfeatures import class_feature_stats
from flcore.training.parttraining import fine_tune_whole_model, part_optimizer, train_head_then_base

HEAD_EPOCHS = 1  # the paper's and PFLlib's classifier stage


class clientPAC(Client):
    batched = Refused("its body stage is pulled towards global prototypes with statistics measured between the "
                      "stages; not ported to the batched engine")
    shared_path = "base"
    # The optimiser of the head stage carries the lr schedule; the statistics are computed in train()
    # and read by the server in the same round, so an executor must bring them back.
    persistent_attrs = ("head_optimizer", "head_scheduler", "feature_variance", "class_reference",
                        "prototypes", "prototype_counts")

    hparams: FedPACParams

    def setup(self) -> None:
        self.lamda = self.hparams.alignment_weight
        self.optimizer, self.learning_rate_scheduler = part_optimizer(self, self.model.base)
        self.head_optimizer, self.head_scheduler = part_optimizer(self, self.model.head)
        # Received from the server (absent in the first round).
        self.global_prototypes: Optional[torch.Tensor] = None      # (C, D)
        self.global_prototype_mask: Optional[torch.Tensor] = None  # (C,) classes some client holds
        # Uploaded to the server.
        self.feature_variance: float = float("nan")               # V_i of the QP
        self.class_reference: Optional[torch.Tensor] = None       # (C, D): p_i(k) * mean feature of class k
        self.prototypes: Optional[torch.Tensor] = None            # (C, D) after training
        self.prototype_counts: Optional[torch.Tensor] = None      # (C,)

    def set_global_prototypes(self, prototypes: torch.Tensor, present: torch.Tensor) -> None:
        self.global_prototypes = prototypes.detach().clone()
        self.global_prototype_mask = present.detach().clone()

    def local_training(self) -> None:
        train_head_then_base(self, HEAD_EPOCHS, self.classification_loss, self.local_loss)

    def begin_local_training(self) -> None:
        """Statistics of the body just received, before local training changes it (as the paper does)."""
        stats = class_feature_stats(self.model.base, self.train_data, self.num_classes)
        self.feature_variance, self.class_reference = qp_statistics(stats.counts, stats.sums, stats.sq_norm_sums)

    def end_local_training(self) -> None:
        stats = class_feature_stats(self.model.base, self.train_data, self.num_classes)
        self.prototypes = stats.means()
        self.prototype_counts = stats.counts

    def upload_extras(self) -> dict:
        """The head (combined per client on the server), the prototypes and the QP's statistics."""
        head = {name: t.detach() for name, t in named_tensors(self.model.head).items()}
        return {"head": head, "prototypes": self.prototypes, "prototype_counts": self.prototype_counts,
                "feature_variance": self.feature_variance, "class_reference": self.class_reference}

    def classification_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.loss(self.model(x), y)

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        features = self.model.base(x)
        loss = self.loss(self.model.head(features), y)
        if self.global_prototypes is not None and self.lamda > 0:
            loss = loss + self.lamda * feature_alignment_loss(features, y, self.global_prototypes,
                                                              self.global_prototype_mask)
        return loss

    def fine_tune(self, epochs: int) -> None:
        fine_tune_whole_model(self, epochs)


def feature_alignment_loss(features: torch.Tensor, labels: torch.Tensor, prototypes: torch.Tensor,
                           present: torch.Tensor) -> torch.Tensor:
    """Mean over the batch's B x D entries of (feature - global prototype of its class)^2.

    A sample whose class has no global prototype contributes zero (it still counts in the mean, as
    in the reference code's MSE over the whole batch).
    """
    target = torch.where(present[labels].unsqueeze(1), prototypes[labels].to(features.dtype), features.detach())
    return nn.functional.mse_loss(features, target)


def qp_statistics(counts: torch.Tensor, sums: torch.Tensor, sq_norm_sums: torch.Tensor):
    """FedPAC's per-client inputs of the head-combination QP, from per-class feature sums.

    ``reference[k] = p(k) * mu_k`` (= sums[k] / n) estimates E[z * 1{y = k}], the quantity a linear
    head is fitted to; ``variance`` is the variance of that estimate from n samples:
    (1/n) * sum_k (p(k) E[||z||^2 | k] - ||p(k) mu_k||^2) = (sum_k sq_norm_sums[k] - ||sums[k]||^2 / n) / n^2.
    """
    n = counts.sum()
    reference = (sums / n).float()
    variance = (sq_norm_sums.sum() - (sums * sums).sum() / n) / (n * n)
    return max(float(variance), 0.0), reference
