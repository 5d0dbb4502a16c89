"""FedGC (Yifan Niu, Weihong Deng, "Federated Learning for Face Recognition with Gradient Correction",
AAAI 2022).

Shared and averaged by sample count: the body (``base``). Local: each client's head, a bias-free linear
layer of class embeddings over the classes it holds (``clientgc``), trained with a softmax over those
classes only. The server keeps a copy of every client's head: after each round it stores the uploaded
ones and moves all of them one step down FedGC's softmax-based regulariser,
``W <- W - lamda * lr * grad Reg(W)`` (``-lam``, default 1; ``flcore/training/gradient_correction.py``),
which pushes each client's embeddings away from the other clients' embeddings of other classes: the
cross-client gradient that the local softmaxes lack. Every client receives its own corrected head with the
body. Each client reports the received body with its own head, over its own classes.

Where PFLlib's version differs, this follows the paper: the anchor of each term is the client's own class
embedding (PFLlib uses the mean of the holders' embeddings of that class, once per holder), and the
negatives are every other client's embeddings of other classes (PFLlib skips every client that also holds
the anchor's class). With disjoint class sets, the paper's case, both readings are the paper's. A test
sample of a class the client never trained on counts as an error (PFLlib maps it to the client's first
class). The paper's CosFace margin is face-specific; here, as in PFLlib, the softmax is the plain one its
derivation starts from.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from flcore.clients.clientgc import clientGC
from flcore.exchange import ClientUpdate
from flcore.hyperparameters import FedGCParams
from flcore.servers.serverbase import Server
from flcore.trainmodel.models import BaseHeadSplit
from flcore.trainmodel.shapes import head_in_features
from flcore.training.gradient_correction import corrected_embeddings
from utils.datasets import DatasetInfo


def with_class_embeddings(model: BaseHeadSplit) -> BaseHeadSplit:
    """``model`` with a bias-free copy of its linear head: one embedding (row) per class, as initialised."""
    head = model.head
    embeddings = nn.utils.skip_init(nn.Linear, head_in_features(head), head.out_features, bias=False,
                                    device=head.weight.device, dtype=head.weight.dtype)
    with torch.no_grad():
        embeddings.weight.copy_(head.weight)
    return BaseHeadSplit(model.base, embeddings)


class FedGC(Server):
    """New clients (-nnc): the global body and a fresh head over their own classes (the initial embeddings
    every training client started from), then -ften epochs of FedGC's local update (cross-entropy over their
    own classes, body and head); the server's regulariser never sees them."""
    client_class = clientGC
    persistent_attrs = ("class_embeddings",)

    hparams: FedGCParams

    def __init__(self, config, hparams: FedGCParams, times: int, model: nn.Module, data: DatasetInfo,
                 store=None):
        super().__init__(config, hparams, times, with_class_embeddings(model), data, store)

    def setup(self) -> None:
        self.server_step = self.hparams.server_step_scale * self.config.local_learning_rate
        initial = self.global_model.head.weight.detach()
        # (N, C, D): the server's copy of every client's head, and (N, C) which classes each one holds.
        self.class_embeddings = initial.unsqueeze(0).repeat(len(self.clients), 1, 1)
        self.held_classes = torch.stack([client.held_classes for client in self.clients])

    def send_models(self) -> None:
        super().send_models()
        for client in self.in_use(self.clients):
            client.receive_class_embeddings(self.class_embeddings[client.id])

    def extras_problem(self, update: ClientUpdate) -> Optional[str]:
        embeddings = update.extras.get("class_embeddings")
        expected = tuple(self.class_embeddings.shape[1:])
        if not isinstance(embeddings, torch.Tensor) or tuple(embeddings.shape) != expected:
            return f"its class embeddings are not a tensor of shape {expected}"
        if not bool(torch.isfinite(embeddings).all()):
            return "its class embeddings hold a NaN or infinite value"
        return None

    def aggregate_parameters(self) -> None:
        super().aggregate_parameters()
        for update in self.uploads:
            self.class_embeddings[update.client_id] = update.extras["class_embeddings"].to(self.class_embeddings)
        self.class_embeddings = corrected_embeddings(self.class_embeddings, self.held_classes, self.server_step)
