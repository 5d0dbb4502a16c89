"""SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, "SCAFFOLD: Stochastic Controlled
Averaging for Federated Learning", ICML 2020).

Everything is shared. Clients correct every local step with ``c - c_i`` and refresh ``c_i``
(option II). The server keeps the global control variate ``c`` (persistent) and, as in the paper's
Algorithm 1, takes the uniform mean over the participants S:
``x <- x + slr * mean_{i in S}(y_i - x)`` (``-slr``, default 1) and ``c <- c + sum_{i in S} delta_c_i / N``
with N the number of all clients. Buffers (BN statistics) take the plain mean. Each client reports
the received global model.
"""
from __future__ import annotations

from typing import Dict, List

import torch

from flcore.aggregation import copy_into, named_tensors, weighted_average, zeros_like_parameters
from flcore.clients.clientscaffold import clientSCAFFOLD
from flcore.clients.parked_modules import frozen_copy_of
from flcore.hyperparameters import SCAFFOLDParams
from flcore.servers.serverbase import Server


class SCAFFOLD(Server):
    """New clients (-nnc): the global model, then -ften epochs of plain, uncorrected cross-entropy fine-
    tuning (a newcomer has no control variate; c is not sent)."""
    client_class = clientSCAFFOLD
    persistent_attrs = ("control",)

    hparams: SCAFFOLDParams

    def setup(self) -> None:
        self.server_learning_rate = self.hparams.server_learning_rate
        self.control: Dict[str, torch.Tensor] = zeros_like_parameters(self.global_shared_module())
        self.uploaded_control_deltas: List[Dict[str, torch.Tensor]] = []

    def send_models(self) -> None:
        super().send_models()
        # Only the clients about to train read c: one frozen copy of it, which they keep by reference.
        sent = frozen_copy_of(self.control, prefix="scaffold.control")
        for client in self.selected_clients:
            client.receive_control(sent)

    def receive_models(self) -> None:
        super().receive_models()
        self.uploaded_control_deltas = [update.extras["control_delta"] for update in self.uploads]

    def drop_uploads(self) -> None:
        super().drop_uploads()
        self.uploaded_control_deltas = []

    @torch.no_grad()
    def aggregate_parameters(self) -> None:
        if not self.uploads:
            return
        participants = len(self.uploads)
        mean = self.average_uploads([1.0 / participants] * participants)  # uniform, as in the paper
        current = named_tensors(self.global_shared_module())
        controlled = [n for n in self.control if n in mean]
        delta_sum = weighted_average(self.uploaded_control_deltas, [1.0] * participants, controlled)
        for name in controlled:
            # x + slr * mean_i(y_i - x) = x + slr * (mean_i(y_i) - x)
            mean[name] = current[name] + self.server_learning_rate * (mean[name] - current[name])
            self.control[name].add_(delta_sum[name], alpha=1.0 / self.num_clients)
        copy_into(self.global_shared_module(), mean)
