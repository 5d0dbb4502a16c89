"""A server that keeps every client's latest upload, for methods whose clients never share one averaged
model but read each other's (FedMTL's task models, APPLE's core models)."""
from __future__ import annotations

from typing import List, Optional

from flcore.aggregation import State
from flcore.servers.serverbase import Server


class LatestModelsServer(Server):
    """``latest_models[i]``: client i's last upload (parameters and buffers, by name), or None until it
    uploads, when it still holds the initial model every client starts from (``initial_model``)."""
    persistent_attrs = ("latest_models",)

    def setup(self) -> None:
        self.latest_models: List[Optional[State]] = [None] * self.num_clients
        self.initial_model: State = {n: t.detach().clone() for n, t in self.shared_tensors().items()}

    def store_uploads(self) -> None:
        """Keep this round's uploads as their clients' latest models (copies: a client trains on)."""
        for update in self.uploads:
            self.latest_models[update.client_id] = {n: t.detach().clone() for n, t in update.tensors.items()}

    def known_models(self) -> List[State]:
        """Every client's model as the server last saw it."""
        return [self.initial_model if m is None else m for m in self.latest_models]
