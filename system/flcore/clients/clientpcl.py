"""FedPCL's client (Tan, Long, Ma, Liu, Zhou, Jiang, "Federated Learning from Pre-Trained Models: A
Contrastive Learning Approach", NeurIPS 2022).

The whole model stays local; only its feature extractor ``base`` is used (the head is not). A feature is
``z = normalize(base(x))``, and a client's local prototype of class k the mean of ``z`` over its samples
of k. Each round the client receives a bank of prototypes: the global prototypes, then every client's
latest local prototypes (the classes a client lacks filled with the global ones). Local training
minimises the paper's prototype-wise contrastive loss::

    L_g + (1/M) sum_m L_m,   L_s = mean_b -log softmax_k(z_b . P_s[k] / tau)[y_b]

over the global set ``s = g`` and the M clients' sets; a class with no prototype in a set leaves that
set's softmax (and a sample of it adds nothing there). Before any prototype exists (round 0) the loss is
0, so the first round only measures prototypes. After training the client measures its local prototypes
with the trained model and uploads them; it classifies by them, the class of the most similar local
prototype (``z . P[k]``, the score its softmax is trained on).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from flcore.clients.clientbase import EVAL_BATCH_SIZE, Client
from flcore.hyperparameters import FedPCLParams
from flcore.trainmodel.shapes import head_in_features
from flcore.training.classvectors import ClassMeanAccumulator, ClassVectors
from flcore.training.objective import Fixed, Objective
from flcore.vmapped.support import PLAIN
from utils.client_data import ClientData
from utils.metrics import ClientTestStats

BANK = Fixed("prototype_bank")          # (S, C, D): the global prototypes, then each client's set
BANK_PRESENT = Fixed("bank_present")    # (S, C) bool: which prototypes exist
# Stands for -inf in a masked softmax: finite, so a set with no prototype at all gives no NaN.
ABSENT_LOGIT = -1e9


def prototype_contrastive_loss(features: torch.Tensor, labels: torch.Tensor, bank: torch.Tensor,
                               present: torch.Tensor, tau: float) -> torch.Tensor:
    """``L_g + mean_m L_m`` (module docstring) for unit ``features`` (B, D), ``labels`` (B,), the prototype
    ``bank`` (S, C, D) whose first set is the global one, and ``present`` (S, C) bool."""
    sets, batch = bank.shape[0], labels.shape[0]
    logits = torch.einsum("bd,scd->sbc", features, bank.to(features.dtype)) / tau            # (S, B, C)
    logits = logits.masked_fill(~present.unsqueeze(1), ABSENT_LOGIT)
    index = labels.unsqueeze(0).expand(sets, batch)                                          # (S, B)
    nll = torch.logsumexp(logits, dim=2) - logits.gather(2, index.unsqueeze(2)).squeeze(2)  # (S, B)
    counted = present.gather(1, index).to(features.dtype)                                    # (S, B)
    per_set = (nll * counted).sum(dim=1) / batch                                             # (S,)
    return per_set[0] + per_set[1:].mean() if sets > 1 else per_set[0]


@dataclass(frozen=True)
class PrototypeContrast(Objective):
    """:func:`prototype_contrastive_loss` of ``normalize(base(x))`` against the client's prototype bank."""
    tau: float

    def inputs(self):
        return (BANK, BANK_PRESENT)

    def __call__(self, model, x, y):
        features = F.normalize(model(x, part="base"), dim=1)
        return prototype_contrastive_loss(features, y, model.fixed(BANK), model.fixed(BANK_PRESENT), self.tau)


class PrototypeClassifier(nn.Module):
    """Scores ``normalize(base(x)) . P[k] / tau`` (B, C) against the prototypes ``P`` (C, D); a class without a
    prototype scores -inf (every class scores 0 when there is none at all)."""

    def __init__(self, base: nn.Module, prototypes: torch.Tensor, present: torch.Tensor, tau: float):
        super().__init__()
        self.base = base
        self.tau = tau
        self.register_buffer("prototypes", prototypes, persistent=False)
        self.register_buffer("present", present, persistent=False)
        self.any_present = bool(present.any())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = F.normalize(self.base(x), dim=1) @ self.prototypes.to(x.dtype).T / self.tau
        return scores.masked_fill(~self.present, float("-inf")) if self.any_present else torch.zeros_like(scores)


class clientPCL(Client):
    batched = PLAIN  # its objective reads only the round's prototype bank; prototypes are measured in the end hook
    # The local prototypes classify this client in every later round, so they are state.
    persistent_attrs = ("prototype_vectors", "prototype_present")

    hparams: FedPCLParams

    def setup(self) -> None:
        self.tau = self.hparams.temperature
        self.objective = PrototypeContrast(self.tau)
        dim, device = head_in_features(self.model.head), self.train_data.y.device
        self.prototype_vectors = torch.zeros(self.num_classes, dim, device=device)
        self.prototype_present = torch.zeros(self.num_classes, dtype=torch.bool, device=device)
        # Sent by the server before every round (an empty bank until someone has uploaded prototypes).
        self.prototype_bank = torch.zeros(1, self.num_classes, dim, device=device)
        self.bank_present = torch.zeros(1, self.num_classes, dtype=torch.bool, device=device)

    # ----- exchange -----------------------------------------------------------------------------
    def receive_class_vectors(self, bank: ClassVectors) -> None:
        """The prototype bank: ``vectors`` (S, C, D), ``present`` (S, C); the global set first."""
        self.prototype_bank, self.bank_present = bank.vectors, bank.present

    def local_prototypes(self) -> ClassVectors:
        return ClassVectors(self.prototype_vectors, self.prototype_present)

    def upload_extras(self) -> dict:
        return {"class_vectors": self.local_prototypes()}

    # ----- local training -----------------------------------------------------------------------
    def end_local_training(self) -> None:
        self.measure_local_prototypes()
        super().end_local_training()

    def fine_tune(self, epochs: int) -> None:
        """A new client trains with FedPCL's own loss against the bank it received, then measures the local
        prototypes it is classified by."""
        self.model.train()
        self.run_epochs(epochs, self.local_loss)
        self.measure_local_prototypes()

    @torch.no_grad()
    def measure_local_prototypes(self) -> None:
        """Mean of ``normalize(base(x))`` per class over the training data, the model in eval mode."""
        self.model.eval()
        accumulator = ClassMeanAccumulator(self.num_classes)
        for x, y in self.train_data.eval_batches(EVAL_BATCH_SIZE):
            accumulator.add(F.normalize(self.model.base(x), dim=1), y)
        self.model.train()
        means = accumulator.means()
        self.prototype_vectors, self.prototype_present = means.vectors, means.present

    # ----- inference: the most similar local prototype -------------------------------------------
    def evaluation_model(self) -> nn.Module:
        return PrototypeClassifier(self.model.base, self.prototype_vectors, self.prototype_present, self.tau)

    def test_metrics(self, data: Optional[ClientData] = None, model: Optional[nn.Module] = None) -> ClientTestStats:
        if not bool(self.prototype_present.any()):
            # No prototype yet (never trained): nothing can be predicted; a constant score has AUC 1/2.
            data = self.test_data if data is None else data
            return ClientTestStats(0, len(data), 0.5)
        return super().test_metrics(data, model)
