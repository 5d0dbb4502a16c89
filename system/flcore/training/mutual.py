"""Clients that train two models at once, each distilled from the other's predictions (FML, FedKD).

``model`` is the SHARED model (uploaded, and what the broadcast overwrites, so that ``X+LAG`` ranks only
its tensors): FML's meme model, FedKD's mentee. ``private_model`` never leaves the client and is what it
reports: FML's local model, FedKD's mentor. Every minibatch takes one SGD step on both, from one
backward pass of the sum of the two losses: each loss reads the other model's outputs as fixed targets,
so each model moves by the gradient of its own loss alone.
"""
from __future__ import annotations

import copy
from typing import List

import torch
import torch.nn.functional as F
from torch import nn

from flcore.clients.clientbase import Client


def distillation(logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """``KL(softmax(target_logits) || softmax(logits))``, summed over the classes and averaged over the
    batch (both (B, C)); the target is not differentiated."""
    return F.kl_div(F.log_softmax(logits, dim=1), F.log_softmax(target_logits.detach(), dim=1),
                    reduction="batchmean", log_target=True)


class MutualLearningClient(Client):
    """A client with a private model beside the shared one, both stepped by one optimiser: the private
    model at ``-lr``, the shared one at :meth:`shared_learning_rate`. Subclasses write ``local_loss``."""
    persistent_attrs = ("private_model",)

    def setup(self) -> None:
        self.private_model = copy.deepcopy(self.model)
        self.optimizer = self.make_optimizer(self.parameter_groups())
        self.learning_rate_scheduler = self.make_scheduler(self.optimizer)

    def shared_learning_rate(self) -> float:
        return self.learning_rate

    def parameter_groups(self) -> List[dict]:
        """The optimiser's groups: the private model's parameters at -lr, then the shared model's."""
        return [{"params": list(self.private_model.parameters())},
                {"params": list(self.model.parameters()), "lr": self.shared_learning_rate()}]

    def begin_local_training(self) -> None:
        self.private_model.train()

    def fine_tune(self, epochs: int) -> None:
        """A new client trains both its models for ``epochs`` epochs the method's way, from what the server
        gave it (the global shared model and a fresh private one)."""
        self.model.train()
        self.begin_local_training()
        self.run_epochs(epochs, self.local_loss)

    def evaluation_model(self) -> nn.Module:
        """The private model (the server also measures the shared one, by name)."""
        return self.private_model
