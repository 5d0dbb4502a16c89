"""``--executor batched``: the round's selected clients train together on this process's device.

Clients are sorted by their number of minibatches and trained in groups of ``--batch_clients`` (0: all of
the round's clients at once, but see :func:`one_at_a_time_here`); each group is one stacked model and one
vmapped step per minibatch (:mod:`flcore.vmapped.engine`); evaluation groups them the same way
(:mod:`flcore.vmapped.evaluation`). The trained state lands in the server's client
objects in place, and each client's :meth:`~flcore.clients.clientbase.Client.upload` is then the round's
update, as it is after sequential training.

Results equal ``--executor sequential`` up to float rounding (vmap batches the matrix products and
convolutions of many clients, so sums are taken in another order): same batches, same generator
states, same learning-rate schedule, parameters within about 1e-5.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from flcore.vmapped.engine import EngineError, train_group
from flcore.vmapped.evaluation import evaluate_group, evaluates_as_base, same_structure
from flcore.vmapped.functional import FunctionalNet
from flcore.vmapped.schedule import order_key
from flcore.vmapped.stacking import StackedData
from flcore.vmapped.support import Recipe, client_problem, model_problem, recipe_of
from flcore.clients.clientbase import DivergenceError
from flcore.exchange import ClientUpdate
from flcore.executors.sequential import SequentialExecutor, evaluate_in_turn
from flcore.trainmodel.models import CONVOLUTIONAL
from utils import progress
from utils.errors import ConfigError, RunError
from utils.metrics import ClientEvaluation


def one_at_a_time_here(model: str, device: torch.device) -> bool:
    """Whether the automatic choice trains one client at a time: a model the project runs channels-last
    (``CONVOLUTIONAL``), on a CPU.

    There the sequential path is faster: it runs convolutions and pooling in the channels-last layout,
    which a vmapped step cannot keep (measured on MNIST / CNN, 20 clients, one thread: the batched step
    0.58x the sequential one; max-pooling alone 54 ms vmapped against 11 ms channels-last for 20 clients'
    batches). On a GPU, where one small client leaves the device idle, every client of a round is batched.
    """
    return device.type == "cpu" and model in CONVOLUTIONAL


class BatchedExecutor:
    """Trains each round's selected clients in groups of ``batch_clients``. 0 chooses: every client of the
    round at once, except a channels-last (convolutional image) model on a CPU, which trains one client at
    a time through its own ``train()`` (:func:`one_at_a_time_here`); a number forces the batched engine on
    any device."""

    def __init__(self, server, batch_clients: int = 0):
        self.server = server
        self.batch_clients = max(int(batch_clients or 0), 0)
        client_class = type(server.clients[0]) if server.clients else server.client_class
        problem = client_problem(client_class, server.algorithm) or model_problem(server.config.model)
        if problem:
            raise ConfigError(problem)
        self.one_at_a_time = self.batch_clients == 0 and one_at_a_time_here(server.config.model, server.device)
        if self.one_at_a_time:
            print("note: --executor batched trains this convolutional model one client at a time on the CPU, "
                  "where that is faster; --batch_clients N forces the batched engine")
        # Uploads carry the last minibatch's gradients only when they are scored (FedLAG's last_batch).
        self.keep_grads = server.upload_needs_gradients()
        self._empty_caches()

    def train(self, clients: Sequence) -> List[ClientUpdate]:
        if self.one_at_a_time:
            return SequentialExecutor().train(clients)
        progress.current().begin("train", len(clients))
        if not clients:
            return []
        recipe = self._recipe(clients)
        for client in clients:  # each trained in its own modules, all of them in use for the round's steps
            client.check_out()
        if self.net is None:
            self.net = FunctionalNet(clients[0].model)
        position = {c.id: i for i, c in enumerate(clients)}
        ordered = sorted(clients, key=order_key)
        size = self.batch_clients or len(ordered)
        for start in range(0, len(ordered), size):
            group = ordered[start:start + size]
            try:
                diverged = train_group(group, recipe, self.net, self.data, self.server.clients, self.keep_grads)
            except EngineError as err:
                raise RunError(f"{err}; run with --executor sequential") from None
            if diverged:
                # As sequentially: the first diverged client in the round's order is the one reported.
                raise DivergenceError(min(diverged, key=position.__getitem__))
            progress.current().advance(len(group))
        return [client.release(client.upload()) for client in clients]

    def evaluate_clients(self, clients: Sequence, model_of=None) -> List[ClientEvaluation]:
        """The clients' test statistics and train losses, in groups of ``batch_clients`` (0: all at once)
        when they keep the base client's evaluation on models of one structure; otherwise (and for a
        convolutional model on a CPU, as in training) one client at a time."""
        if self.one_at_a_time or not clients or len({type(c) for c in clients}) != 1 \
                or not evaluates_as_base(type(clients[0])) \
                or not all(len(c.test_data) and len(c.train_data) for c in clients):
            return evaluate_in_turn(clients, model_of)
        for client in clients:
            client.check_out()
        models = [c.evaluation_model() if model_of is None else model_of(c) for c in clients]
        if not same_structure(models):
            return evaluate_in_turn(clients, model_of)
        net = FunctionalNet(models[0])
        size = self.batch_clients or len(clients)
        results: List[ClientEvaluation] = []
        for start in range(0, len(clients), size):
            group = slice(start, start + size)
            results += evaluate_group(clients[group], models[group], net, self.test_data, self.data,
                                      self.server.clients)
            progress.current().advance(len(clients[group]))
        for client in clients:
            client.park()
        return results

    def _recipe(self, clients: Sequence) -> Recipe:
        classes = {type(c) for c in clients}
        if len(classes) != 1:
            raise RunError(f"--executor batched trains one client class at a time, got "
                           f"{sorted(c.__qualname__ for c in classes)}; run with --executor sequential")
        entry = recipe_of(classes.pop())
        if not isinstance(entry, Recipe):
            raise ConfigError(client_problem(type(clients[0]), self.server.algorithm))
        return entry

    def _empty_caches(self) -> None:
        """What the engine holds on the device, empty: each split's data is gathered at first use, the
        model template made from the first client trained."""
        self.data, self.test_data = StackedData("train_data"), StackedData("test_data")
        self.net: Optional[FunctionalNet] = None

    def close(self) -> None:
        self._empty_caches()
