"""APPLE (Luo, Wu, "Adapt to Adaptation: Learning Personalization for Cross-Silo Federated Learning",
IJCAI 2022).

Every client owns a core model theta_i and a directed relationship vector p_i, and reports its personalised
model ``sum_j p_ij theta_j``: it learns how much of each other client's core model to take (``clientapple``).
Shared: the core models; the server keeps each client's latest upload (a client not trained yet: the initial
model, which every core model starts from) and sends all of them to each selected client before it trains.
Nothing is averaged. Local: p_i, and the personalised model. p_i starts at p0, the clients' shares of the
training samples, and is pulled towards it by ``mu_r/2 ||p_i - p0||^2`` with ``mu_r = -mu * (1 + cos(pi r /
R)) / 2`` for rounds r < R = -L * -gr and 0 after (the paper's cosine schedule): early rounds stay near a
sample-weighted average, later ones personalise freely. Every client's p_i is recorded after each round
(``apple_relationships``, rounds x clients x clients).

As in the paper's cross-silo setting, a client downloads every core model; the authors' optional limit on
downloads per round is not implemented. Unlike PFLlib, which trains every client every round, only the
``-jr`` selected clients train, as in every other method here. PFLlib's relationship gradient is the mean of
the elementwise products ``grad * theta_j`` per tensor, averaged over tensors; here it is the inner
product the paper's chain rule gives (autograd, as in the authors' code).

Under ``X+LAG`` the layers kept personal are not mixed: a client's personalised model takes them from its
own core model.
"""
from __future__ import annotations

import math
from typing import Dict

import numpy as np
import torch

from flcore.aggregation import copy_into, sample_weights, weighted_average
from flcore.clients.clientapple import clientAPPLE
from flcore.hyperparameters import APPLEParams
from flcore.servers.latestmodels import LatestModelsServer


def faded_pull(mu: float, current_round: int, fading_rounds: int) -> float:
    """``mu * (1 + cos(pi r / R)) / 2`` for r < R, else 0: from mu at round 0 down to 0 at round R."""
    if current_round >= fading_rounds:
        return 0.0
    return mu * (1.0 + math.cos(math.pi * current_round / fading_rounds)) / 2.0


class APPLE(LatestModelsServer):
    """New clients (-nnc): the mix every client's personalised model starts from, ``sum_j p0_j theta_j`` over
    the training clients' latest core models (a newcomer has no relationships learnt, and no other client
    mixes in its model), then -ften epochs of plain cross-entropy fine-tuning at -lr; they report that model."""
    whole_uploads_needed = "its clients download each other's uploaded core models whole"
    client_class = clientAPPLE

    hparams: APPLEParams

    def setup(self) -> None:
        super().setup()  # every client's latest core model
        self.initial_relationships = torch.tensor(sample_weights([c.train_samples for c in self.clients]))
        for client in self.in_use(self.clients):
            client.start_relationships(self.initial_relationships)
        self.fading_rounds = int(self.hparams.pull_fraction * self.global_rounds)

    def pull_weight(self) -> float:
        """mu_r of the current round."""
        return faded_pull(self.hparams.relationship_pull, self.current_round, self.fading_rounds)

    def stacked_core_models(self) -> Dict[str, torch.Tensor]:
        """Every client's core model as the server last saw it, stacked: name -> (N, *shape)."""
        models = self.known_models()
        names = [n for n, _ in self.global_shared_module().named_parameters()]
        return {name: torch.stack([m[name] for m in models]) for name in names}

    def send_models(self) -> None:
        """Each selected client gets every core model (one stack, read by all of them) and mu_r."""
        if not self.selected_clients:
            return
        stacked, weight, personal = self.stacked_core_models(), self.pull_weight(), self.personal_names()
        for client in self.selected_clients:
            client.receive_core_models(stacked, weight, personal)

    def aggregate_parameters(self) -> None:
        """No average: each upload becomes its client's core model as the others will download it."""
        self.store_uploads()

    def end_round(self, rnd: int) -> None:
        relationships = [c.relationships.p.detach().cpu().numpy() for c in self.in_use(self.clients)]
        self.record("apple_relationships", np.stack(relationships))

    def receive_new_client(self, client: clientAPPLE) -> None:
        mix = weighted_average(self.known_models(), self.initial_relationships.tolist())
        copy_into(client.shared_module(), mix)
        copy_into(client.personalised_model, mix)
