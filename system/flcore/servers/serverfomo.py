"""FedFomo (Zhang, Sapra, Fidler, Yeung, Alvarez, "Personalized Federated Learning with First Order
Model Optimization", ICLR 2021).

There is no global model. The server keeps every client's last upload (whole model) and an affinity
matrix ``P``. Each selected client downloads the ``-M`` stored models of other clients with the highest
affinity ``P[i, j]`` (ties broken at random by the server's sampler), weighs them on its validation
split with ``relu((L_old - L_j) / ||theta_j - theta_old||)``, normalised, replaces its model by the
weighted combination (keeping its own if no download helps), and trains. The server then stores the
uploads and adds each client's raw weights to its row of ``P``. Each client reports
its own model (after the combination, as every method reports what it holds once the broadcast is
in). The paper's epsilon-greedy exploration of downloads has no PFLlib flag and is not used.
The fraction of selected clients that kept their own model is recorded as ``rs_fomo_kept_own``.
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np

from flcore.aggregation import State
from flcore.clients.clientfomo import clientFomo
from flcore.hyperparameters import FedFomoParams
from flcore.servers.serverbase import Server


class FedFomo(Server):
    """New clients (-nnc): a fresh model (the initial model every training client started from) and, as in
    a round, -M downloads of stored client models, chosen at random (a newcomer has no affinities yet),
    which it weighs on its validation split and combines, keeping its own model if none helps; then -ften
    epochs of plain cross-entropy fine-tuning."""
    whole_uploads_needed = "its clients download each other's uploaded models whole"
    client_class = clientFomo
    persistent_attrs = ("affinity", "stored_models")

    hparams: FedFomoParams

    def setup(self) -> None:
        self.models_per_client = self.hparams.models_per_client
        self.affinity = np.zeros((self.num_clients, self.num_clients), dtype=np.float64)
        # Each client's last upload (parameters and buffers), by client id; None until it uploads.
        self.stored_models: List[Optional[State]] = [None] * self.num_clients

    def downloads_for(self, client_id: int) -> List[int]:
        """Ids of the ``-M`` other clients with a stored model and the highest affinity to ``client_id``."""
        available = np.array([j for j, m in enumerate(self.stored_models) if m is not None and j != client_id],
                             dtype=np.int64)
        if len(available) == 0:
            return []
        shuffled = self.sampler.permutation(available)  # ties (e.g. all affinities 0) broken at random
        order = np.argsort(-self.affinity[client_id, shuffled], kind="stable")
        return shuffled[order][:self.models_per_client].tolist()

    def new_client_downloads(self) -> List[int]:
        """Ids of the ``-M`` stored models a new client downloads: any, at random (it has no affinities)."""
        available = np.array([j for j, m in enumerate(self.stored_models) if m is not None], dtype=np.int64)
        return self.sampler.permutation(available)[:self.models_per_client].tolist()

    def receive_new_client(self, client: clientFomo) -> None:
        ids = self.new_client_downloads()
        client.combine_downloads(ids, [self.stored_models[j] for j in ids])

    def send_models(self) -> None:
        for client in self.in_use(self.selected_clients):
            ids = self.downloads_for(client.id)
            client.combine_downloads(ids, [self.stored_models[j] for j in ids], self.personal_names())
        if self.selected_clients:
            kept = [c.kept_own_model for c in self.selected_clients]
            self.record("rs_fomo_kept_own", float(np.mean(kept)))

    def aggregate_parameters(self) -> None:
        """Store the uploads and add the uploaders' download weights to their affinities."""
        for update in self.uploads:
            self.stored_models[update.client_id] = {n: t.clone() for n, t in update.tensors.items()}
            for j, weight in update.extras["download_weights"].items():
                self.affinity[update.client_id, j] += weight
