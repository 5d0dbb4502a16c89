"""FD's client (Jeong et al., "Communication-Efficient On-Device Machine Learning: Federated
Distillation and Augmentation under Non-IID Private Data", 2018).

The whole model stays local. While it trains, the client averages its logits per label (the
paper's local-average logit vectors, collected during local training, as the paper does) and
uploads them. Its loss is ``CE(model(x), y) + lamda * KL(softmax(g_y) || softmax(model(x)))`` with
``g_y`` the global average logit of the label; samples whose label has no global logit add nothing.
The KL term has the same gradient as PFLlib's soft-target cross-entropy and is 0 when matched.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from flcore.vmapped.support import Refused
from flcore.clients.clientbase import Client
from flcore.hyperparameters import FDParams
from flcore.training.classvectors import ClassMeanAccumulator, ClassVectors


def distillation_loss(logits: torch.Tensor, labels: torch.Tensor, teacher: ClassVectors) -> torch.Tensor:
    """Batch mean of ``KL(softmax(teacher_y) || softmax(logits))``; rows without a teacher add 0."""
    target = F.softmax(teacher.vectors[labels].to(logits.dtype), dim=1)
    per_sample = F.kl_div(F.log_softmax(logits, dim=1), target, reduction="none").sum(dim=1)
    return (per_sample * teacher.present[labels].to(logits.dtype)).mean()


class clientFD(Client):
    batched = Refused("it collects per-label logits over every step of training")

    hparams: FDParams

    def setup(self) -> None:
        self.lamda = self.hparams.distillation_weight
        # Rebuilt every round: the global logits arrive with each broadcast, the local ones are
        # collected afresh during each local training.
        self.global_logits: Optional[ClassVectors] = None
        self._has_teacher = False  # checked once per broadcast, not per batch (no device sync)
        self.local_logits: Optional[ClassVectors] = None
        self._logit_means = self._new_accumulator()

    def _new_accumulator(self) -> ClassMeanAccumulator:
        return ClassMeanAccumulator(self.num_classes, dim=self.num_classes, device=self.train_data.y.device)

    def receive_class_vectors(self, logits: ClassVectors) -> None:
        self.global_logits = logits
        self._has_teacher = bool(logits.present.any())

    def upload_class_vectors(self) -> ClassVectors:
        if self.local_logits is None:
            raise RuntimeError(f"client {self.id} uploads logits before training")
        return self.local_logits

    def upload_extras(self) -> dict:
        return {"class_vectors": self.upload_class_vectors()}

    def begin_local_training(self) -> None:
        super().begin_local_training()
        self._logit_means = self._new_accumulator()

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.model(x)
        self._logit_means.add(logits, y)
        loss = self.loss(logits, y)
        if self.lamda != 0 and self._has_teacher:
            loss = loss + self.lamda * distillation_loss(logits, y, self.global_logits)
        return loss

    def end_local_training(self) -> None:
        self.local_logits = self._logit_means.means()
        super().end_local_training()

    def fine_tune(self, epochs: int) -> None:
        """A new client trains with FD's own loss: cross-entropy plus distillation from the global logits."""
        self.model.train()
        self.begin_local_training()
        self.run_epochs(epochs, self.local_loss)
