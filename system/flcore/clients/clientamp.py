"""FedAMP's client (Huang, Chu, Zhou, Wang, Liu, Pei, Zhang, "Personalized Cross-Silo Federated
Learning on Non-IID Data", AAAI 2021).

The client keeps and trains its own model ``w_i``; nothing is copied into it. The server sends a
personalised cloud model ``u_i`` and local training minimises
``CE + lamda / (2 alphaK) * ||w_i - u_i||^2`` (the paper's proximal step). PFLlib's version
takes the norm unsquared and on detached ``.data``, so its regulariser has no gradient at all; here
it is the paper's squared norm, differentiated. Tensors the server leaves out of ``u_i`` (the layers
``X+LAG`` keeps personal) are not pulled. Each client reports its own model.
"""
from __future__ import annotations

from typing import Dict

import torch

from flcore.vmapped.support import Refused
from flcore.clients.clientbase import Client
from flcore.hyperparameters import FedAMPParams


class clientAMP(Client):
    batched = Refused("its pull towards the per-client cloud model is not ported to the batched engine")

    hparams: FedAMPParams

    def setup(self) -> None:
        self.lamda = self.hparams.proximal_weight
        self.alphaK = self.hparams.attention_step
        # u_i by parameter name. Rebuilt by every broadcast to a selected client, right before it trains.
        self.cloud_model: Dict[str, torch.Tensor] = {}

    def receive_cloud_model(self, cloud: Dict[str, torch.Tensor]) -> None:
        self.cloud_model = cloud

    def proximal_term(self) -> torch.Tensor:
        """``||w - u||^2`` over the tensors of ``u`` (differentiable in ``w``)."""
        params = dict(self.model.named_parameters())
        return torch.stack([(params[n] - u).pow(2).sum() for n, u in self.cloud_model.items()]).sum()

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = self.loss(self.model(x), y)
        if self.lamda == 0 or not self.cloud_model:
            return loss
        return loss + self.lamda / (2 * self.alphaK) * self.proximal_term()
