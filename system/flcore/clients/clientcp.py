"""FedCP's client (Zhang et al., "FedCP: Separating Feature Information for Personalized Federated
Learning via Conditional Policy", KDD 2023).

``client.model`` is a :class:`FedCPModel`. Shared: ``base``, ``global_head``, ``policy`` (the CPN);
personal: ``head``. Per minibatch, with ``z = base(x)`` and a Gumbel-softmax policy ``(r, s)``::

    loss = CE(head(z * r) + global_head(z * s), y) + lam * MMD^2(z, base0(x))

where ``base0`` is the base received this round, frozen. The context and ``base0`` are fixed at the
start of the round; the global head takes no gradient. After training, the uploaded global head
is ``0.5 * head + 0.5 * global_head`` (the authors' way of passing personal knowledge to it).
"""
from __future__ import annotations

import copy
from typing import Optional

import torch

from flcore.aggregation import copy_into, named_tensors
from flcore.vmapped.support import Refused
from flcore.clients.clientbase import Client
from flcore.hyperparameters import FedCPParams
from flcore.trainmodel.fedcp_model import gumbel_noise, rbf_mmd


class clientCP(Client):
    batched = Refused("every step draws Gumbel noise from the client's generator, interleaved with the batch "
                      "order")

    hparams: FedCPParams

    def setup(self) -> None:
        self.lamda = self.hparams.mmd_weight
        # Built once and refreshed in place every round: the base as received, for the MMD term.
        self.received_base = copy.deepcopy(self.model.base).requires_grad_(False)
        self.round_context: Optional[torch.Tensor] = None
        self.personal_share_sum = torch.zeros((), device=self.train_data.y.device)
        self.personal_share_batches = 0

    def shares(self, name: str) -> bool:
        return not name.startswith("head.")

    def begin_local_training(self) -> None:
        copy_into(self.received_base, named_tensors(self.model.base))
        # Same mode as the trained base, so that at the first step both give identical features.
        self.received_base.train()
        self.round_context = self.model.context()
        self.personal_share_sum = torch.zeros((), device=self.train_data.y.device)
        self.personal_share_batches = 0

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        features = self.model.base(x)
        noise = gumbel_noise((features.shape[0], 2, features.shape[1]), self.generator, features.device)
        logits, personal_share = self.model.predict(features, self.round_context, noise)
        self.personal_share_sum += personal_share.detach().mean()
        self.personal_share_batches += 1
        loss = self.loss(logits, y)
        if self.lamda:
            with torch.no_grad():
                reference = self.received_base(x)
            loss = loss + self.lamda * rbf_mmd(features, reference)
        return loss

    @torch.no_grad()
    def end_local_training(self) -> None:
        personal = dict(self.model.head.named_parameters())
        for name, param in self.model.global_head.named_parameters():
            param.mul_(0.5).add_(personal[name], alpha=0.5)

    def personal_share(self) -> float:
        """Mean personal share ``r`` of the features over the last round's training batches."""
        return float(self.personal_share_sum) / max(self.personal_share_batches, 1)

    def upload_extras(self) -> dict:
        return {"personal_share": self.personal_share()}  # recorded by the server, not aggregated
