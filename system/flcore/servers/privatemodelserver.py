"""A server whose clients keep a private model beside the shared one and report it (FML, FedKD).

The shared model is averaged (each method its own way). ``rs_test_acc`` is the private models' accuracy,
the methods' headline; ``rs_global_*`` is the shared model's, on the same clients in the same round (as
Ditto records its two). The server never sees a private model: a new client (-nnc) receives the global
shared model and a fresh private model, the initial one every training client's private model started from.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from torch import nn

from flcore.aggregation import copy_into, named_tensors
from flcore.servers.serverbase import Server
from flcore.training.mutual import MutualLearningClient
from utils.metrics import Summary

GLOBAL_PREFIX = "rs_global"


class PrivateModelServer(Server):
    def setup(self) -> None:
        super().setup()
        # Where every private model starts (a copy of the model each client is built with). The global model
        # moves with training, so newcomers take this copy; the same seed rebuilds it on resume.
        self.initial_private = {name: t.detach().clone() for name, t in named_tensors(self.global_model).items()}

    def receive_new_client(self, client: MutualLearningClient) -> None:
        super().receive_new_client(client)
        copy_into(client.private_model, self.initial_private)

    def evaluate(self, clients: Optional[Sequence[MutualLearningClient]] = None, prefix: str = "rs",
                 model_of: Optional[Callable[[MutualLearningClient], nn.Module]] = None) -> Summary:
        summary = super().evaluate(clients, prefix, model_of)
        if prefix == "rs" and model_of is None:
            super().evaluate(clients, prefix=GLOBAL_PREFIX, model_of=lambda client: client.model)
        return summary
