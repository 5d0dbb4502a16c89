"""FedDBE (Jianqing Zhang, Yang Hua, Jian Cao, Hao Wang, Tao Song, Zhengui Xue, Ruhui Ma, Haibing
Guan, "Eliminating Domain Bias for Federated Learning in Representation Space", NeurIPS 2023).

Shared: the whole model, averaged by sample count. Local: a learnable feature bias per client
(PRBM), added to the base's features before the head. Extra loss: ``-klw`` times the mean-squared
gap between the round's running feature mean (momentum ``-mo``) and a global feature mean (MR).
Each client reports the received model with its own bias (PFLLIB.md section 6).

The global mean is fixed once, before round 0, as in the paper's initialisation period: every
client trains a private copy of the initial global model for ``-ls`` epochs and reports its running
feature mean; the server takes their sample-weighted average. PFLlib does this by training the
clients' own models with the global random generators, so the mean depends on client order and on
every earlier draw. Here each client trains from the same initial model with its own generator, the
copies are discarded (round 0 starts from the initial model, as in PFLlib where the first broadcast
overwrites them) and the average is accumulated in client-id order: the same seed gives the same
mean bit for bit, whatever order clients run in. The mean is server state (saved in checkpoints)
and goes to every client with each broadcast.
"""
from __future__ import annotations

import torch

from flcore.aggregation import sample_weights, weighted_average
from flcore.clients.clientdbe import clientDBE
from flcore.hyperparameters import FedDBEParams
from flcore.servers.serverbase import Server


class FedDBE(Server):
    """New clients (-nnc): the global model, the global feature mean and a fresh personal feature bias
    (zero, as every training client's started), then -ften epochs of FedDBE's own local update
    (cross-entropy through the bias, plus -klw times the mean regulariser), so the bias learns the
    newcomer's representation shift."""
    client_class = clientDBE
    persistent_attrs = ("global_feature_mean",)

    hparams: FedDBEParams

    def setup(self) -> None:
        self.global_feature_mean = self.initial_global_mean()

    def initial_global_mean(self) -> torch.Tensor:
        means = [{"mean": client.initial_feature_mean(self.global_model)} for client in self.clients]
        weights = sample_weights([client.train_samples for client in self.clients])
        return weighted_average(means, weights)["mean"]

    def send_models(self) -> None:
        super().send_models()
        for client in self.clients:
            client.global_mean = self.global_feature_mean

    def receive_new_client(self, client: clientDBE) -> None:
        super().receive_new_client(client)
        client.global_mean = self.global_feature_mean
