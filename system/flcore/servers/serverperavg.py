"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning with Theoretical Guarantees:
A Model-Agnostic Meta-Learning Approach", NeurIPS 2020).

The whole model is shared and averaged as in FedAvg; clients train it with first-order MAML steps
(inner step ``-lr``, meta step ``-bt``; see ``clientperavg``). What is reported for each client is the
shared model after one SGD step on one of its training batches; the step is undone after measuring.

Differences from PFLlib, on purpose: the meta step size is ``-bt`` (PFLlib ignores it and reuses the
learning rate); each client trains once per round (PFLlib calls ``train()`` twice, silently doubling ``-ls``); the
train loss is the adapted model's plain loss (PFLlib's ``train_metrics`` takes an SGD step per batch
while measuring); the meta-gradient is applied at w (an older PFLlib applied it at w_tilde).
"""
from __future__ import annotations

from contextlib import ExitStack
from typing import Optional, Sequence

from flcore.clients.clientperavg import clientPerAvg
from flcore.servers.serverbase import Server
from utils.metrics import Summary


class PerAvg(Server):
    """New clients (-nnc): the global (meta-learned) model, then -ften epochs of plain SGD at the inner
    step size -lr on their own data; like every PerAvg client they are tested after one more SGD step on
    one of their training batches, so -ften 0 is exactly Per-FedAvg's personalisation of a new user."""
    client_class = clientPerAvg

    def evaluate(self, clients: Optional[Sequence[clientPerAvg]] = None, prefix: str = "rs") -> Summary:
        clients = self.evaluation_clients() if clients is None else clients
        with ExitStack() as adapted:
            for client in self.in_use(clients):
                adapted.enter_context(client.one_step_adapted())
            return super().evaluate(clients, prefix)
