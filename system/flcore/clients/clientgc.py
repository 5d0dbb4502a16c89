"""FedGC's client (Niu and Deng, "Federated Learning for Face Recognition with Gradient Correction", AAAI 2022).

The body (``base``) is shared and averaged. The head is a bias-free linear layer whose rows are class
embeddings, and it is the client's own: it classifies only the classes the client holds (a softmax over
its local classes, as each face client knows only its own identities). The rows of the other classes are
kept out of the softmax by an infinite logit offset, so they never train and are never predicted. After
training the head goes to the server in the update's extras (``class_embeddings``), where the
cross-client regulariser moves it; the server sends it back before the client's next round.
"""
from __future__ import annotations

import torch
from torch import nn

from flcore.clients.clientbase import Client
from flcore.clients.clientlc import Calibrated
from flcore.hyperparameters import FedGCParams
from flcore.vmapped.support import PLAIN


def local_class_offsets(held: torch.Tensor) -> torch.Tensor:
    """(C,) float32 logit offsets: 0 for a class the client holds, +inf for one it lacks (its logit, less
    the offset, is -inf: out of the softmax, without gradient and never the argmax)."""
    return torch.where(held, torch.zeros(held.shape), torch.full(held.shape, float("inf"))).to(held.device)


class LocalClassesModel(nn.Module):
    """``model(x) - offsets``: the client's model restricted to its own classes."""

    def __init__(self, model: nn.Module, offsets: torch.Tensor):
        super().__init__()
        self.model = model
        self.register_buffer("offsets", offsets, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x) - self.offsets


class clientGC(Client):
    batched = PLAIN  # cross-entropy over the local classes, FedLC's objective with 0 / +inf offsets
    shared_path = "base"
    objective = Calibrated()

    hparams: FedGCParams

    def setup(self) -> None:
        # Fixed by the client's data, so derived here rather than carried as state.
        self.held_classes = torch.bincount(self.train_data.y, minlength=self.num_classes) > 0
        self.logit_offsets = local_class_offsets(self.held_classes)

    def receive_class_embeddings(self, embeddings: torch.Tensor) -> None:
        """The server's copy of this client's head (C, D), moved by the cross-client regulariser."""
        with torch.no_grad():
            self.model.head.weight.copy_(embeddings)

    def upload_extras(self) -> dict:
        return {"class_embeddings": self.model.head.weight.detach()}

    def fine_tune(self, epochs: int) -> None:
        """A new client trains body and head on its own classes, as a training client does."""
        self.model.train()
        self.run_epochs(epochs, self.local_loss)

    def evaluation_model(self) -> nn.Module:
        return LocalClassesModel(self.model, self.logit_offsets)
