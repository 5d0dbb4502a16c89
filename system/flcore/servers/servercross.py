"""FedCross (Hu, Zhou, Yue, Ling, Huang, Li, Liu, Lian, Chen, "FedCross: Towards Accurate Federated
Learning via Multi-Model Cross-Aggregation", arXiv 2210.08285).

The server keeps K middleware models (K = clients per round, -jr of -nc), all starting as the initial
model. Each round they are dispatched to the selected clients in a random order drawn from the seed and
the round (with -rjr, client p of that order trains model p mod K); each client trains its model with
plain cross-entropy, as FedAvg's clients do, and uploads it. A middleware model takes its client's upload
(the sample-weighted mean where -rjr gave it several; a model whose upload was dropped by -cdr keeps its
value), then every model j is fused with one collaborator c(j): ``m_j <- alpha * m_j + (1 - alpha) *
m_c(j)`` (``-ca``), c(j) being the least similar model (``-cmss 1``, the default), the most similar (2) or
the next one in turn (0; ``crossaggregation``). The global model is the unweighted mean of the K models.
Rounds before ``-fsb`` are FedAvg rounds: the global model is the sample-weighted mean of the uploads and
every middleware model restarts from it. The chosen collaborators are recorded as ``fedcross_collaborators``
(rounds of cross-aggregation x K).

Shared: every parameter, travelling as whole middleware models. Reported: the global model, on every
client (the paper deploys it to all); the middleware models are never evaluated. PFLlib evaluates what
each client last held, and compares models by a sum of cosines over pairs of tensors; here a model is
one vector.

X+LAG: a client keeps its LAG-personal layers whatever middleware model it trains (they never travel
to it) and reports the global model with those layers in place.
"""
from __future__ import annotations

import copy
from collections import defaultdict
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
from torch import nn

from flcore.aggregation import State, copy_into, named_tensors, sample_weights, weighted_average
from flcore.clients.clientavg import clientAVG
from flcore.clients.clientbase import Client
from flcore.crossaggregation import collaborators, cosine_similarities, cross_aggregate
from flcore.hyperparameters import FedCrossParams
from flcore.servers.serverbase import Server
from utils.metrics import Summary

DISPATCH_STREAM = 0xFC  # the dispatch order's stream, beside the run's seed and the round


class FedCross(Server):
    """New clients (-nnc): the global model (the mean of the middleware models), then -ften epochs of plain
    cross-entropy fine-tuning."""
    whole_uploads_needed = "each middleware model takes its client's whole upload"
    client_class = clientAVG
    persistent_attrs = ("middleware",)

    hparams: FedCrossParams

    def setup(self) -> None:
        self.alpha = self.hparams.self_weight
        self.strategy = self.hparams.collaborator_strategy
        self.first_stage_rounds = self.hparams.first_stage_rounds
        start = {name: t.detach().clone() for name, t in self.shared_tensors().items()}
        self.middleware: List[State] = [copy.deepcopy(start) for _ in range(self.num_join_clients)]
        self.slot_of: Dict[int, int] = {}  # client id -> the middleware model it trains this round

    # ----- dispatch --------------------------------------------------------------------------------
    def dispatch_order(self, clients: Sequence[Client]) -> Dict[int, int]:
        """Client id -> middleware model, in an order drawn from the seed and the round only (so neither the
        client sampler nor a resume changes it)."""
        rng = np.random.default_rng([self.config.seed % 2**32, DISPATCH_STREAM, self.current_round])
        order = rng.permutation(len(clients))
        return {clients[i].id: position % len(self.middleware) for position, i in enumerate(order)}

    def send_models(self) -> None:
        """Every client receives the global model (what FedCross reports), then each selected client its
        middleware model, less what X+LAG keeps personal."""
        super().send_models()
        names = list(self.broadcast())
        self.slot_of = self.dispatch_order(self.selected_clients)
        for client in self.selected_clients:
            model = self.middleware[self.slot_of[client.id]]
            client.set_parameters({name: model[name] for name in names})

    # ----- aggregation -----------------------------------------------------------------------------
    def aggregate_parameters(self) -> None:
        if not self.uploads:
            return
        by_slot = defaultdict(list)
        for update in self.uploads:
            by_slot[self.slot_of[update.client_id]].append(update)
        for slot, updates in sorted(by_slot.items()):
            weights = sample_weights([u.num_samples for u in updates])
            self.middleware[slot] = weighted_average([u.tensors for u in updates], weights)
        if self.current_round < self.first_stage_rounds:
            average = self.average_uploads()
            self.middleware = [{n: t.clone() for n, t in average.items()} for _ in self.middleware]
        else:
            parameters = [name for name, _ in self.global_shared_module().named_parameters()]
            partners = collaborators(cosine_similarities(self.middleware, parameters), self.strategy,
                                     self.current_round)
            self.middleware = cross_aggregate(self.middleware, partners, self.alpha)
            average = weighted_average(self.middleware, [1.0 / len(self.middleware)] * len(self.middleware))
            self.record("fedcross_collaborators", partners)
        copy_into(self.global_shared_module(), average)

    # ----- evaluation ------------------------------------------------------------------------------
    def reported_model(self, client: Client) -> nn.Module:
        """The global model, with the client's own layers in place under X+LAG."""
        personal = self.personal_names()
        if not personal:
            return self.global_model
        model = copy.deepcopy(self.global_model)
        own = named_tensors(client.model)
        copy_into(model, {name: own[name] for name in personal})
        return model

    def evaluate(self, clients: Optional[Sequence[Client]] = None, prefix: str = "rs",
                 model_of: Optional[Callable[[Client], nn.Module]] = None) -> Summary:
        """Each round's evaluation measures the global model on every client; after training (rs_after) and on
        new clients (rs_new), each client's own model."""
        if prefix == "rs" and model_of is None:
            model_of = self.reported_model
        return super().evaluate(clients, prefix, model_of)
