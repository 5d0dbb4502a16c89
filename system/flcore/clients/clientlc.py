"""FedLC's client (Zhang, Li, Li, Xu, Wu, Ding, Wu, "Federated Learning with Label Distribution Skew
via Logits Calibration", ICML 2022).

The whole model is shared. Local training uses cross-entropy on calibrated logits
``f(x)_c - tau * n_c^(-1/4)``, with ``n_c`` this client's own count of class c in its training set
(the paper's ``n_{m,c}``): rare local classes get a larger margin, so a skewed client no longer pushes
the logits of its rare and missing classes down as hard. A class the client never sees (``n_c = 0``)
gets the limit of the formula, an infinite offset: it leaves the softmax normaliser and its logit
gets no gradient, computed without NaN. Evaluation uses the raw logits.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from flcore.vmapped.support import PLAIN
from flcore.clients.clientbase import Client
from flcore.hyperparameters import FedLCParams
from flcore.training.objective import Fixed, Objective

OFFSETS = Fixed("logit_offsets")  # (C,) this client's tau * n_c^(-1/4)


def calibration_offsets(class_counts: torch.Tensor, tau: float) -> torch.Tensor:
    """``tau * n_c^(-1/4)`` per class (float32); ``+inf`` where ``n_c = 0``; zeros when ``tau = 0``."""
    counts = class_counts.to(torch.float32)
    if tau == 0:  # no calibration; avoids 0 * inf for absent classes
        return torch.zeros_like(counts)
    offsets = tau * counts.clamp(min=1).pow(-0.25)
    return torch.where(counts > 0, offsets, torch.full_like(offsets, float("inf")))


@dataclass(frozen=True)
class Calibrated(Objective):
    """``CE(model(x) - offsets, y)`` with the client's own per-class offsets (:func:`calibration_offsets`)."""

    def inputs(self):
        return (OFFSETS,)

    def __call__(self, model, x, y):
        return F.cross_entropy(model(x) - model.fixed(OFFSETS), y)


class clientLC(Client):
    batched = PLAIN
    objective = Calibrated()

    hparams: FedLCParams

    def setup(self) -> None:
        self.tau = self.hparams.calibration_strength
        # Fixed by the client's data, so derived here rather than carried as state.
        self.class_counts = torch.bincount(self.train_data.y, minlength=self.num_classes)
        self.logit_offsets = calibration_offsets(self.class_counts, self.tau)
