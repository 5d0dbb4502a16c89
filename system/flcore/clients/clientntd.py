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

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from flcore.vmapped.support import PLAIN
from flcore.hyperparameters import FedNTDParams
from flcore.training.objective import Objective
from flcore.training.received import RECEIVED, ReceivedModelClient


def not_true_logits(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(B, C) logits without each row's true-class entry: (B, C-1), other classes in order.

    A gather (column ``j`` of the result is class ``j``, or ``j + 1`` from the true class on), not a
    boolean mask: its shape does not depend on the values, so ``vmap`` batches it; the entries, and
    the gradient each one passes back, are the mask's exactly."""
    columns = torch.arange(logits.shape[1] - 1, device=logits.device).unsqueeze(0)  # (1, C-1)
    index = columns + (columns >= targets.unsqueeze(1)).long()                      # (B, C-1)
    return torch.gather(logits, 1, index)


def not_true_distillation(local_logits: torch.Tensor, global_logits: torch.Tensor, targets: torch.Tensor,
                          tau: float) -> torch.Tensor:
    """``tau^2 * mean_batch KL(softmax(g_nt / tau) || softmax(l_nt / tau))`` over not-true classes."""
    local = F.log_softmax(not_true_logits(local_logits, targets) / tau, dim=1)
    teacher = F.softmax(not_true_logits(global_logits, targets) / tau, dim=1)
    return tau ** 2 * F.kl_div(local, teacher, reduction="batchmean")


@dataclass(frozen=True)
class NotTrueDistilled(Objective):
    """``CE(model(x), y) + beta * not_true_distillation(model(x), received(x), y, tau)``, the received
    model being the teacher (eval mode); cross-entropy alone when ``beta`` is 0."""
    beta: float
    tau: float

    def inputs(self):
        return (RECEIVED,) if self.beta else ()

    def __call__(self, model, x, y):
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        if self.beta == 0:  # FedAvg exactly, without the teacher's forward pass
            return loss
        global_logits = model.teacher(RECEIVED, x)
        return loss + self.beta * not_true_distillation(logits, global_logits, y, self.tau)


class clientNTD(ReceivedModelClient):
    batched = PLAIN

    hparams: FedNTDParams

    def setup(self) -> None:
        super().setup()
        self.beta = self.hparams.distillation_weight
        self.tau = self.hparams.temperature
        self.objective = NotTrueDistilled(self.beta, self.tau)
