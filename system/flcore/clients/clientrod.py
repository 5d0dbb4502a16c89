"""FedROD's client (Chen & Chao, "On Bridging Generic and Personalized Federated Learning for Image
Classification", ICLR 2022).

``client.model`` is the generic model (base + generic head); it is trained with the balanced
softmax loss and shared whole. ``personal_head`` is a second linear head that never leaves the
client: it is trained with cross-entropy on ``generic_logits + personal_logits`` computed from
detached features and detached generic logits, so it only learns a client-specific correction.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from flcore.vmapped.support import Refused
from flcore.clients.clientbase import Client
from flcore.training.label_counts import class_counts


def balanced_softmax_loss(logits: torch.Tensor, labels: torch.Tensor, log_counts: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of ``logits + log n_c`` (Ren et al., NeurIPS 2020, used by FedROD's Eq. 5).

    A class absent from the client's data has ``log 0 = -inf``: its predicted probability is exactly
    zero, so the loss neither rewards nor penalises the generic head for it.
    """
    return F.cross_entropy(logits + log_counts, labels)


class GenericPlusPersonalHead(nn.Module):
    """FedROD's prediction: ``generic_head(z) + personal_head(z)`` on the shared features ``z``."""

    def __init__(self, model: nn.Module, personal_head: nn.Module):
        super().__init__()
        self.model = model
        self.personal_head = personal_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.model.base(x)
        return self.model.head(features) + self.personal_head(features)


class clientROD(Client):
    batched = Refused("every step also trains a personal head with its own optimiser")
    persistent_attrs = ("personal_head", "personal_optimizer")
    personal_layer_attrs = ("personal_head",)  # FedLAG's K counts it (flcore/lag/mixin.py)

    def setup(self) -> None:
        # As in PFLlib, the personal head starts as a copy of the initial generic head.
        self.personal_head = copy.deepcopy(self.model.head)
        self.personal_optimizer = torch.optim.SGD(self.personal_head.parameters(), lr=self.learning_rate)
        self.log_class_counts = class_counts(self.train_data.y, self.num_classes).log()

    def begin_local_training(self) -> None:
        self.personal_head.train()

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        features = self.model.base(x)
        generic_logits = self.model.head(features)
        generic_loss = balanced_softmax_loss(generic_logits, y, self.log_class_counts)
        # Both inputs of the personal term are detached, so one backward pass gives the generic model
        # exactly the balanced-softmax gradient and the personal head exactly its own: the same two
        # updates PFLlib makes with two backward passes on the same minibatch.
        personal_logits = self.personal_head(features.detach())
        personal_loss = self.loss(generic_logits.detach() + personal_logits, y)
        return generic_loss + personal_loss

    def after_step(self) -> None:
        self.personal_optimizer.step()
        self.personal_optimizer.zero_grad(set_to_none=True)

    def fine_tune(self, epochs: int) -> None:
        """A new client: FedROD's own local update, so the personal head learns along with the generic model."""
        self.model.train()
        self.begin_local_training()
        self.run_epochs(epochs, self.local_loss)

    def evaluation_model(self) -> nn.Module:
        return GenericPlusPersonalHead(self.model, self.personal_head)

    @torch.inference_mode()
    def generic_test_accuracy(self) -> tuple[int, int]:
        """(correct, samples) of the generic model alone on this client's test set."""
        self.model.eval()
        logits, labels = self._predict(self.model, self.test_data)
        return int((logits.argmax(dim=1) == labels).sum()), len(labels)
