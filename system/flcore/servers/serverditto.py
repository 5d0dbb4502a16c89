"""Ditto (Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021).

The global model is trained and averaged exactly as in FedAvg; each client also keeps a personal
model pulled towards the received global one by ``mu/2 * ||v - w||^2`` (see ``clientditto``).
Both are reported, each under its own name: ``rs_test_acc`` is the personal models' accuracy (the
method's headline), ``rs_global_test_acc`` the global model's, measured on the same clients in the
same round. PFLlib appends both to ``rs_test_acc`` in turn; that interleaving is not reproduced.
"""
from __future__ import annotations

from typing import Optional, Sequence

from flcore.clients.clientditto import clientDitto
from flcore.servers.serverbase import Server
from utils.metrics import Summary

GLOBAL_PREFIX = "rs_global"


class Ditto(Server):
    """New clients (-nnc): the global model, which is also where their personal model starts, then -ften
    epochs of Ditto's personal objective (cross-entropy plus the -mu pull towards that global model);
    the personal model is tested."""
    client_class = clientDitto

    def evaluate(self, clients: Optional[Sequence[clientDitto]] = None, prefix: str = "rs") -> Summary:
        summary = super().evaluate(clients, prefix)
        if prefix == "rs":
            super().evaluate(clients, prefix=GLOBAL_PREFIX, model_of=lambda client: client.model)
        return summary
