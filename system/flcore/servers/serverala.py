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

from flcore.clients.clientala import clientALA
from flcore.lagaware import lag_personal_names
from flcore.servers.serverbase import ConfigError, Server


class FedALA(Server):
    """New clients (-nnc): the global model whole, without Adaptive Local Aggregation (a newcomer has no
    local model worth mixing in: its own would be the initial one), then -ften epochs of plain cross-
    entropy fine-tuning."""
    client_class = clientALA

    def __init__(self, args, times, model, data):
        tensors = len(list(model.parameters()))
        if not 1 <= args.layer_idx <= tensors:
            raise ConfigError(f"-p/--layer_idx is the number of top parameter tensors FedALA mixes and must be in "
                              f"[1, {tensors}] for this model, got {args.layer_idx}")
        if not 0 < args.rand_percent <= 100:
            raise ConfigError(f"-s/--rand_percent is the percentage of local data FedALA learns its weights on "
                              f"and must be in (0, 100], got {args.rand_percent}")
        if not args.eta > 0:
            raise ConfigError(f"-et/--eta is FedALA's weight-learning rate and must be > 0, got {args.eta}")
        super().__init__(args, times, model, data)

    def send_models(self) -> None:
        keep = lag_personal_names(self)
        shared = self.global_shared_module()
        for client in self.clients:
            client.adaptive_local_aggregation(shared, keep)
        weights = [w.reshape(-1) for client in self.clients for w in client.ala_weights.values()]
        self.record("rs_ala_weight_mean", float(torch.cat(weights).double().mean()))
