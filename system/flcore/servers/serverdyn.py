"""FedDyn (Acar, Zhao, Matas, Mattina, Whatmough, Saligrama, "Federated Learning Based on Dynamic
Regularization", ICLR 2021).

Everything is shared. Clients add the dynamic regulariser ``-<w, g_k> + alpha/2 ||w - w_global||^2``
(``-al``, default 1) and keep ``g_k`` across rounds. The server keeps ``h`` (persistent):
``h <- h - alpha/N * sum_{k in P} (w_k - w_global)`` with N the number of all clients, then
``w_global <- mean_{k in P} w_k - h/alpha``. The mean is uniform over the participants P, as in the
paper's Algorithm 1 and the authors' code (not sample-weighted). Buffers (BN statistics) take the
plain mean. Each client reports the received global model.
"""
from __future__ import annotations

from typing import Dict

import torch

from flcore.aggregation import copy_into, named_tensors, zeros_like_parameters
from flcore.clients.clientdyn import clientDyn
from flcore.hyperparameters import FedDynParams
from flcore.servers.serverbase import Server


class FedDyn(Server):
    """New clients (-nnc): the global model (the server's corrected average), then -ften epochs of plain
    cross-entropy fine-tuning (a newcomer has no gradient estimate g_k, so no dynamic regulariser)."""
    client_class = clientDyn
    persistent_attrs = ("server_state",)

    hparams: FedDynParams

    def setup(self) -> None:
        self.alpha = self.hparams.regulariser_weight
        # The paper's h: -alpha/N times the sum of every drift w_k - w_global uploaded so far.
        self.server_state: Dict[str, torch.Tensor] = zeros_like_parameters(self.global_shared_module())

    @torch.no_grad()
    def aggregate_parameters(self) -> None:
        if not self.uploads:
            return
        participants = len(self.uploads)
        mean = self.average_uploads([1.0 / participants] * participants)  # uniform, as in the paper
        current = named_tensors(self.global_shared_module())
        for name, h in self.server_state.items():
            if name not in mean:
                continue
            # sum_{k in P} (w_k - w_global) = |P| * (mean - w_global)
            h.sub_(mean[name] - current[name], alpha=self.alpha * participants / self.num_clients)
            mean[name] = mean[name] - h / self.alpha
        copy_into(self.global_shared_module(), mean)
