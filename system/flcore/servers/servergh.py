"""FedGH (Yi et al., "FedGH: Heterogeneous Federated Learning with Generalized Global Header",
ACM MM 2023).

Shared: one global head. Local: each client's body (feature extractor), never uploaded or averaged.
Clients upload per-class mean features (prototypes); the server trains the global head on those
(prototype, label) pairs with cross-entropy, one epoch of SGD at ``-slr``, and every client replaces
its head with it. Evaluation: the client's body under the received global head (PFLLIB.md section 6).
``FedGH+LAG`` is refused by the registry: no parameters are uploaded, so there are no updates to rank.

Not reproduced from PFLlib: its server head *is* client 0's head module (``clients[0].model.head``),
so client 0's local training moved the "global" head; here the head is the server's own. Uploads
follow ``-cdr`` like every other method's.
"""
from __future__ import annotations

from typing import List, Tuple

import torch
from torch import nn

from flcore.clients.clientgh import clientGH
from flcore.hyperparameters import FedGHParams
from flcore.servers.serverbase import Server


class FedGH(Server):
    """New clients (-nnc): the global head the server trained on the prototypes and a fresh body (the
    initial body every training client started from), then -ften epochs of cross-entropy on body and
    head together, as FedGH's clients train."""
    client_class = clientGH

    hparams: FedGHParams

    def setup(self) -> None:
        self.head_learning_rate = self.hparams.head_learning_rate
        self.batch_size = self.config.batch_size  # the global head trains on the prototypes in client-sized batches
        self.uploaded_prototypes: List[Tuple[torch.Tensor, torch.Tensor]] = []

    def receive_models(self) -> None:
        super().receive_models()  # who uploads (after -cdr) and their sample weights
        # Prototypes are the whole upload: no client parameters are aggregated.
        self.uploaded_prototypes = [(u.extras["prototypes"], u.extras["prototype_counts"]) for u in self.uploads]

    def aggregate_parameters(self) -> None:
        """Train the global head on the uploaded prototypes (PFLlib: ``train_head``)."""
        features, labels = prototype_examples(self.uploaded_prototypes)
        if labels.numel() == 0:
            self.record("rs_server_head_loss", float("nan"))
            return
        head = self.global_shared_module()
        head.train()
        optimizer = torch.optim.SGD(head.parameters(), lr=self.head_learning_rate)
        order = torch.as_tensor(self.sampler.permutation(len(labels)), device=labels.device)
        total = torch.zeros((), dtype=torch.float64, device=labels.device)
        for start in range(0, len(labels), self.batch_size):
            index = order[start:start + self.batch_size]
            loss = nn.functional.cross_entropy(head(features[index]), labels[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.detach().double() * len(index)
        self.record("rs_server_head_loss", float(total / len(labels)))


def prototype_examples(uploads: List[Tuple[torch.Tensor, torch.Tensor]]) -> Tuple[torch.Tensor, torch.Tensor]:
    """The server's training set: one (prototype, class) pair per class present on each uploader."""
    features, labels = [], []
    for prototypes, counts in uploads:
        present = torch.nonzero(counts > 0).flatten()
        features.append(prototypes[present])
        labels.append(present)
    if not features:
        return torch.zeros(0), torch.zeros(0, dtype=torch.long)
    return torch.cat(features).detach(), torch.cat(labels)
