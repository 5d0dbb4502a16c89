"""``--executor batched``: the round's selected clients train together on this process's device.

Clients are sorted by their number of minibatches and trained in groups of ``--batch_clients`` (0: all
of the round's clients at once); each group is one stacked model and one vmapped step per minibatch
(:mod:`flcore.batched.engine`). The trained state lands in the server's client objects in place, so
the rest of the round (uploads, aggregation, FedLAG's scores, checkpoints) is unchanged.

Results equal ``--executor sequential`` up to float rounding (vmap batches the matrix products and
convolutions of many clients, so sums are taken in another order): same batches, same generator
states, same learning-rate schedule, parameters within about 1e-5.
"""
from __future__ import annotations

from typing import Optional, Sequence

from flcore.batched.engine import EngineError, train_group
from flcore.batched.functional import FunctionalNet
from flcore.batched.schedule import order_key
from flcore.batched.stacking import StackedData
from flcore.batched.support import Recipe, client_problem, model_problem, recipe_of
from flcore.clients.clientbase import DivergenceError
from utils import progress


def _config_error(message: str) -> Exception:
    from flcore.servers.serverbase import ConfigError  # serverbase imports the executors
    return ConfigError(message)


def _run_error(message: str) -> Exception:
    from flcore.servers.serverbase import RunError
    return RunError(message)


class BatchedExecutor:
    """Trains each round's selected clients in groups of ``batch_clients`` (0 = all at once)."""

    def __init__(self, server, batch_clients: int = 0):
        self.server = server
        self.batch_clients = max(int(batch_clients or 0), 0)
        client_class = type(server.clients[0]) if server.clients else server.client_class
        problem = client_problem(client_class, server.algorithm) or model_problem(server.config.model)
        if problem:
            raise _config_error(problem)
        lag = getattr(server, "lag", None)
        # FedLAG's last_batch signal reads each client's last minibatch gradient from .grad.
        self.keep_grads = getattr(lag, "signal", None) == "last_batch"
        self.data = StackedData()
        self.net: Optional[FunctionalNet] = None

    def train(self, clients: Sequence) -> None:
        progress.current().begin("train", len(clients))
        if not clients:
            return
        recipe = self._recipe(clients)
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
                raise _run_error(f"{err}; run with --executor sequential") from None
            if diverged:
                # As sequentially: the first diverged client in the round's order is the one reported.
                raise DivergenceError(min(diverged, key=position.__getitem__))
            progress.current().advance(len(group))

    def _recipe(self, clients: Sequence) -> Recipe:
        classes = {type(c) for c in clients}
        if len(classes) != 1:
            raise _run_error(f"--executor batched trains one client class at a time, got "
                             f"{sorted(c.__qualname__ for c in classes)}; run with --executor sequential")
        entry = recipe_of(classes.pop())
        if not isinstance(entry, Recipe):
            raise _config_error(client_problem(type(clients[0]), self.server.algorithm))
        return entry

    def close(self) -> None:
        self.data = StackedData()
        self.net = None
