"""FedNTD's client (Lee, Jeong, Shin, Yun, "Preservation of the Global Knowledge by Not-True
Distillation in Federated Learning", NeurIPS 2022).

The whole model is shared. Local training adds ``beta * tau^2 * KL(q_global || q_local)`` where
``q`` is the softmax at temperature ``tau`` over the *not-true* classes only (the sample's own label
is removed before the softmax): the client keeps the received global model's view of the classes it
is not currently learning, while its true-class signal comes from cross-entropy alone. ``tau^2``
keeps the gradient scale independent of the temperature (Hinton's distillation scaling; PFLlib
applies it too).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from flcore.hyperparameters import FedNTDParams
from flcore.training.received import ReceivedModelClient


def not_true_logits(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(B, C) logits without each row's true-class entry: (B, C-1), other classes in order."""
    keep = torch.ones_like(logits, dtype=torch.bool)
    keep[torch.arange(logits.shape[0], device=logits.device), targets] = False
    return logits[keep].view(logits.shape[0], logits.shape[1] - 1)


def not_true_distillation(local_logits: torch.Tensor, global_logits: torch.Tensor, targets: torch.Tensor,
                          tau: float) -> torch.Tensor:
    """``tau^2 * mean_batch KL(softmax(g_nt / tau) || softmax(l_nt / tau))`` over not-true classes."""
    local = F.log_softmax(not_true_logits(local_logits, targets) / tau, dim=1)
    teacher = F.softmax(not_true_logits(global_logits, targets) / tau, dim=1)
    return tau ** 2 * F.kl_div(local, teacher, reduction="batchmean")


class clientNTD(ReceivedModelClient):
    hparams: FedNTDParams

    def setup(self) -> None:
        super().setup()
        self.beta = self.hparams.distillation_weight
        self.tau = self.hparams.temperature

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.model(x)
        loss = self.loss(logits, y)
        if self.beta == 0:  # FedAvg exactly, without the teacher's forward pass
            return loss
        with torch.no_grad():
            global_logits = self.received_model(x)
        return loss + self.beta * not_true_distillation(logits, global_logits, y, self.tau)
