"""FedAMP (Huang, Chu, Zhou, Wang, Liu, Pei, Zhang, "Personalized Cross-Silo Federated Learning on
Non-IID Data", AAAI 2021).

Every client keeps its own model; there is no global average. Before a selected client i trains, the
server sends it a personalised cloud model ``u_i = sum_j xi_ij w_j`` over every client's latest
model, with attention weights from the derivative of the attention-inducing function
``A(d) = 1 - exp(-d / sigma)``: ``xi_ij = alphaK * exp(-||w_i - w_j||^2 / sigma) / sigma`` for j != i
and ``xi_ii = 1 - sum_{j != i} xi_ij`` (one gradient step of size alphaK on the attention term).
The client adds ``lamda / (2 alphaK) ||w_i - u_i||^2`` and each client reports its own model.
Flags: ``-alk`` alphaK, ``-sg`` sigma, ``-lam`` lamda. The mean ``xi_ii`` of each round is recorded
as ``rs_amp_self_weight``; ``xi_ii`` turns negative when ``(N - 1) alphaK / sigma > 1`` for N clients
(PFLlib's defaults -alk 1 -sg 1 do that), so pick ``alphaK`` small against ``sigma``.

Under ``X+LAG`` the layers kept personal are left out of both the distances and ``u_i``, so they
are neither compared nor pulled toward other clients.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch

from flcore.aggregation import copy_into, named_tensors, weighted_average
from flcore.clients.clientamp import clientAMP
from flcore.hyperparameters import FedAMPParams
from flcore.servers.serverbase import Server

State = Dict[str, torch.Tensor]


def attention_weights(squared_distances: torch.Tensor, own_index: Sequence[int], alphaK: float,
                      sigma: float) -> torch.Tensor:
    """FedAMP's ``xi``: rows for the receiving clients, columns for all clients.

    ``squared_distances[r, j] = ||w_{own_index[r]} - w_j||^2``; returns ``xi`` of the same shape with
    ``xi[r, j] = alphaK * exp(-d / sigma) / sigma`` off the own column and ``1 - sum`` on it.
    """
    xi = alphaK * torch.exp(-squared_distances / sigma) / sigma
    rows = torch.arange(len(own_index), device=xi.device)
    own = torch.as_tensor(list(own_index), device=xi.device)
    xi[rows, own] = 0.0
    xi[rows, own] = 1.0 - xi.sum(dim=1)
    return xi


class FedAMP(Server):
    """New clients (-nnc): the plain mean of every training client's model, i.e. the cloud model under
    equal attention (a newcomer has no model of its own to measure similarities with, and FedAMP keeps no
    global model), then -ften epochs of plain cross-entropy fine-tuning."""
    client_class = clientAMP

    hparams: FedAMPParams

    def setup(self) -> None:
        self.alphaK = self.hparams.attention_step
        self.sigma = self.hparams.kernel_width

    def cloud_names(self) -> List[str]:
        """The parameter tensors FedAMP compares and shares (all but the ones X+LAG keeps personal)."""
        personal = self.personal_names()
        first = self.clients[0]
        first.check_out()
        return [n for n, _ in first.shared_module().named_parameters()
                if n not in personal]

    @torch.no_grad()
    def cloud_models(self, receivers: Sequence[int], names: Sequence[str]) -> Tuple[torch.Tensor, List[State]]:
        """``(xi, [u_r])`` for the clients at positions ``receivers``, from every client's current model.

        Works tensor by tensor, so no flattened copy of all the models is ever held at once.
        """
        everyone = [dict(c.shared_module().named_parameters()) for c in self.in_use(self.clients)]
        distances = torch.zeros(len(receivers), len(everyone), dtype=torch.float64, device=self.device)
        for name in names:
            stacked = torch.stack([p[name].detach().reshape(-1) for p in everyone])  # (N, d)
            for r, k in enumerate(receivers):
                distances[r] += (stacked - stacked[k]).double().pow(2).sum(dim=1)
        xi = attention_weights(distances, receivers, self.alphaK, self.sigma)
        clouds: List[State] = [{} for _ in receivers]
        for name in names:
            stacked = torch.stack([p[name].detach().reshape(-1) for p in everyone])
            combined = xi.to(stacked.dtype) @ stacked  # (R, d): row r is sum_j xi_rj w_j
            for r in range(len(receivers)):
                clouds[r][name] = combined[r].reshape(everyone[0][name].shape)
        return xi, clouds

    def send_models(self) -> None:
        if not self.selected_clients:
            return
        position = {c.id: k for k, c in enumerate(self.clients)}
        receivers = [position[c.id] for c in self.selected_clients]
        xi, clouds = self.cloud_models(receivers, self.cloud_names())
        for client, cloud in zip(self.selected_clients, clouds):
            client.receive_cloud_model(cloud)
        own_weights = xi[torch.arange(len(receivers), device=xi.device), torch.as_tensor(receivers, device=xi.device)]
        self.record("rs_amp_self_weight", float(own_weights.mean()))

    def aggregate_parameters(self) -> None:
        """No global model: each client's latest model is read directly when the next u_i is formed."""

    def receive_new_client(self, client) -> None:
        """The cloud model with equal attention: the plain mean of the training clients' models."""
        models = [named_tensors(c.shared_module()) for c in self.in_use(self.clients)]
        copy_into(client.shared_module(), weighted_average(models, [1.0 / len(models)] * len(models)))
