"""FedALA (Zhang, Hua, Wang, Shen, Guan, Zhu, "FedALA: Adaptive Local Aggregation for Personalized
Federated Learning", AAAI 2023).

The whole model is uploaded and averaged with FedAvg's sample weights. The broadcast is replaced by
each client's Adaptive Local Aggregation (see ``clientala``): lower layers := global, the last ``-p``
parameter tensors := ``local + (global - local) * W`` with ``W`` in [0, 1] learned on ``-s`` percent
of the local data (lr ``-et``). As in the authors' code every client (selected or not) runs ALA on
every broadcast, and each client reports its ALA-initialised model. The mean of all clients' ``W`` is
recorded per round as ``rs_ala_weight_mean``.
"""
from __future__ import annotations

import torch
from torch import nn

from flcore.clients.clientala import clientALA
from flcore.hyperparameters import FedALAParams
from flcore.servers.serverbase import Server
from utils.errors import ConfigError
from utils.datasets import DatasetInfo


class FedALA(Server):
    """New clients (-nnc): the global model whole, without Adaptive Local Aggregation (a newcomer has no
    local model worth mixing in: its own would be the initial one), then -ften epochs of plain cross-
    entropy fine-tuning."""
    client_class = clientALA

    def __init__(self, config, hparams: FedALAParams, times: int, model: nn.Module, data: DatasetInfo,
                 store=None):
        # The flag's lower bound is checked with the flags; the upper one needs the model.
        tensors = len(list(model.parameters()))
        if hparams.mixed_tensors > tensors:
            raise ConfigError(f"-p/--layer_idx (the number of top parameter tensors FedALA mixes) must be in "
                              f"[1, {tensors}] for this model, got {hparams.mixed_tensors}")
        super().__init__(config, hparams, times, model, data, store)

    def send_models(self) -> None:
        received = self.broadcast()
        for client in self.in_use(self.clients):
            client.adaptive_local_aggregation(received)
        weights = [w.reshape(-1) for client in self.clients for w in client.ala_weights.values()]
        self.record("rs_ala_weight_mean", float(torch.cat(weights).double().mean()))
