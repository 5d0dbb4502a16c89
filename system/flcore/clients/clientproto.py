"""FedProto's client (Tan, Long, Liu, Zhou, Lu, Jiang, Zhang, "FedProto: Federated Prototype
Learning across Heterogeneous Clients", AAAI 2022).

The whole model (``base`` + ``head``) stays local. Local training minimises
``CE(head(base(x)), y) + lamda * MSE(base(x), C_y)`` where ``C_y`` is the global prototype of the
label (samples whose class has no global prototype get no extra term). After training the client
uploads its local prototypes: the mean of ``base(x)`` per class over its training data, computed
with the trained model in eval mode. Inference is the nearest global prototype (squared Euclidean
distance), not the head.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from flcore.vmapped.support import Refused
from flcore.clients.clientbase import EVAL_BATCH_SIZE, Client
from flcore.hyperparameters import FedProtoParams
from flcore.training.classvectors import ClassMeanAccumulator, ClassVectors
from utils.client_data import ClientData
from utils.metrics import ClientTestStats, test_stats


def prototype_distances(features: torch.Tensor, prototypes: ClassVectors) -> torch.Tensor:
    """Squared Euclidean distance of each feature row (B, D) to each class prototype: (B, C).

    Classes without a prototype are at distance +inf, so they are never predicted.
    """
    diff = features.unsqueeze(1) - prototypes.vectors.to(features.dtype).unsqueeze(0)  # (B, C, D)
    distances = diff.pow(2).sum(dim=2)
    return distances.masked_fill(~prototypes.present.unsqueeze(0), float("inf"))


def prototype_loss(features: torch.Tensor, labels: torch.Tensor, prototypes: ClassVectors) -> torch.Tensor:
    """``MSE(features, C_y)`` averaged over all B x D entries; rows whose class has no prototype add 0."""
    has_prototype = prototypes.present[labels].unsqueeze(1)
    target = torch.where(has_prototype, prototypes.vectors[labels].to(features.dtype), features.detach())
    return F.mse_loss(features, target)


def fill_missing(prototypes: ClassVectors, own: ClassVectors) -> ClassVectors:
    """``prototypes``, with ``own``'s vector for every class that ``prototypes`` lacks and ``own`` holds (both
    (C, D) with (C,) presence, or stacked alike: (..., C, D) with (..., C))."""
    take = own.present & ~prototypes.present
    vectors = torch.where(take.unsqueeze(-1), own.vectors.to(prototypes.vectors), prototypes.vectors)
    return ClassVectors(vectors, prototypes.present | own.present)


class clientProto(Client):
    batched = Refused("its prototype regulariser is not ported to the batched engine")

    hparams: FedProtoParams

    def setup(self) -> None:
        self.lamda = self.hparams.prototype_weight
        # Rebuilt every round: the server sends the global prototypes before anything reads them,
        # and the local ones are computed at the end of each local training.
        self.global_prototypes: Optional[ClassVectors] = None
        self._has_prototypes = False  # checked once per broadcast, not per batch (no device sync)
        self.local_prototypes: Optional[ClassVectors] = None

    # ----- exchange -----------------------------------------------------------------------------
    def receive_class_vectors(self, prototypes: ClassVectors) -> None:
        self.global_prototypes = prototypes
        self._has_prototypes = bool(prototypes.present.any())

    def upload_class_vectors(self) -> ClassVectors:
        if self.local_prototypes is None:
            raise RuntimeError(f"client {self.id} uploads prototypes before computing any")
        return self.local_prototypes

    def upload_extras(self) -> dict:
        return {"class_vectors": self.upload_class_vectors()}

    # ----- local training -----------------------------------------------------------------------
    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        features = self.model.base(x)
        loss = self.loss(self.model.head(features), y)
        if self.lamda != 0 and self._has_prototypes:
            loss = loss + self.lamda * prototype_loss(features, y, self.global_prototypes)
        return loss

    def end_local_training(self) -> None:
        self.local_prototypes = self.compute_local_prototypes()
        super().end_local_training()

    def fine_tune(self, epochs: int) -> None:
        """A new client trains with FedProto's own loss, so that its features gather around the global
        prototypes it is classified by (plain cross-entropy would leave them anywhere). A class no training
        client holds has no global prototype and could never be predicted; for those classes the newcomer
        classifies by its own prototype, as the global one would be had it been a holder."""
        self.model.train()
        self.run_epochs(epochs, self.local_loss)
        self.local_prototypes = self.compute_local_prototypes()
        self.receive_class_vectors(fill_missing(self.global_prototypes, self.local_prototypes))

    @torch.no_grad()
    def compute_local_prototypes(self) -> ClassVectors:
        self.model.eval()
        accumulator = ClassMeanAccumulator(self.num_classes)
        for x, y in self.train_data.eval_batches(EVAL_BATCH_SIZE):
            accumulator.add(self.model.base(x), y)
        self.model.train()
        return accumulator.means()

    # ----- inference: the nearest global prototype ----------------------------------------------
    @torch.inference_mode()
    def test_metrics(self, data: Optional[ClientData] = None, model: Optional[nn.Module] = None) -> ClientTestStats:
        """Nearest-prototype accuracy of this client's feature extractor (``model`` is not used: FedProto
        has one model per client)."""
        data = self.test_data if data is None else data
        labels = data.y
        if not self._has_prototypes:
            # No prototype yet (round 0): nothing can be predicted; a constant score has AUC 1/2.
            return ClientTestStats(0, len(labels), 0.5)
        self.model.eval()
        distances = torch.cat([prototype_distances(self.model.base(x), self.global_prototypes)
                               for x, _ in data.eval_batches(EVAL_BATCH_SIZE)])
        # The nearest prototype is the largest negative distance; its softmax is the AUC's score (absent
        # classes get probability 0).
        return test_stats(-distances, labels)
