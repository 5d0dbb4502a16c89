"""A server that exchanges one vector per class instead of model parameters (FedProto, FD).

Every round the server sends each client the global class vectors, the selected clients train and
upload their own per-class vectors (the update's ``class_vectors``), and the server replaces the
global vectors by the per-class average over the clients that hold each class (unweighted, as both
papers do). No parameters are aggregated, so ``X+LAG`` has nothing to rank (the registry refuses it). The global vectors are the server's persistent state.
"""
from __future__ import annotations

from typing import List, Sequence

import torch

from flcore.clients.clientbase import Client
from flcore.servers.serverbase import Server
from flcore.training.classvectors import ClassVectors, average_over_holders


class ClassVectorServer(Server):
    persistent_attrs = ("global_vectors", "global_present")

    def setup(self) -> None:
        classes = int(self.num_classes)
        self.global_vectors = torch.zeros(classes, self.vector_dim(), device=self.device)
        self.global_present = torch.zeros(classes, dtype=torch.bool, device=self.device)
        self.uploaded_vectors: List[ClassVectors] = []

    def vector_dim(self) -> int:
        """Width of the exchanged vectors (feature width for FedProto, class count for FD)."""
        raise NotImplementedError

    def global_class_vectors(self) -> ClassVectors:
        return ClassVectors(self.global_vectors, self.global_present)

    def class_vector_payload(self) -> ClassVectors:
        """What every client receives (``client.receive_class_vectors``): the global class vectors here."""
        return self.global_class_vectors()

    def set_clients(self, ids: Sequence[int]) -> List[Client]:
        clients = super().set_clients(ids)
        # Clients created after training started (-nnc) receive the current global vectors at once:
        # FedProto's new clients classify by them.
        if hasattr(self, "global_vectors"):
            received = self.class_vector_payload()
            for client in clients:
                client.receive_class_vectors(received)
        return clients

    def send_models(self) -> None:
        received = self.class_vector_payload()
        for client in self.clients:
            client.receive_class_vectors(received)

    def receive_models(self) -> None:
        super().receive_models()  # who uploads (client drop-out included), and their weights
        self.uploaded_vectors = [update.extras["class_vectors"] for update in self.uploads]

    def receive_new_client(self, client: Client) -> None:
        """New clients keep the fresh model they are built with (no parameters travel) and hold the global
        class vectors from :meth:`set_clients`; their client's ``fine_tune`` trains with them."""

    def aggregate_parameters(self) -> None:
        if not self.uploaded_vectors:
            return
        average = average_over_holders(self.uploaded_vectors)
        self.global_vectors = average.vectors.to(self.device)
        self.global_present = average.present.to(self.device)
