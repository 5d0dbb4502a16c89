"""The selected clients train one after another in this process (PFLlib's way); and evaluation in turn,
which every executor uses."""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

from torch import nn

from flcore.clients.clientbase import Client
from flcore.exchange import ClientUpdate
from utils import progress
from utils.metrics import ClientEvaluation


def evaluate_in_turn(clients: Sequence[Client],
                     model_of: Optional[Callable[[Client], nn.Module]] = None) -> List[ClientEvaluation]:
    """Each client's test statistics and summed train loss, one client after another in this process, of
    its :meth:`~Client.evaluation_model` or of ``model_of(client)``; each client's modules are parked
    once it is measured, so one working model serves them all."""
    results = []
    for client in clients:
        client.check_out()
        model = None if model_of is None else model_of(client)
        test = client.test_metrics(model=model)
        results.append(ClientEvaluation(test, *client.train_metrics(model=model)))
        client.park()
        progress.current().advance()
    return results


class SequentialExecutor:
    """PFLlib's behaviour: the selected clients train one after another in this process, each parked once
    trained (its update then holds the tensors it keeps). ``keep_gradients``: updates keep the last
    minibatch's gradients (a model's worth per client until the next round) only where the server reads
    them (:meth:`~flcore.servers.serverbase.Server.upload_needs_gradients`), as Ray's workers do."""

    def __init__(self, keep_gradients: bool = True):
        self.keep_gradients = keep_gradients

    def train(self, clients: Sequence[Client]) -> List[ClientUpdate]:
        progress.current().begin("train", len(clients))
        updates = []
        for client in clients:
            client.check_out()
            update = client.train()
            updates.append(client.release(update if self.keep_gradients else update.without_gradients()))
            progress.current().advance()
        return updates

    def evaluate_clients(self, clients: Sequence[Client],
                         model_of: Optional[Callable[[Client], nn.Module]] = None) -> List[ClientEvaluation]:
        return evaluate_in_turn(clients, model_of)

    def close(self) -> None:
        pass
