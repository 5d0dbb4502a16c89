"""A client that picks, among several cluster models, the one of lowest loss on its own training data.

That is IFCA's cluster estimate (every round), and how a CFL client that did not upload in the round
its cluster split, or a newcomer (``-nnc``), finds its cluster. The losses are computed by the client,
on its data; the server only hands it the candidates and reads back the index.
"""
from __future__ import annotations

from typing import List, Mapping, Sequence

import torch

from flcore.clients.clientbase import Client
from flcore.clustering import lowest_loss


class ClusterChoosingClient(Client):
    """A client that takes the cluster model fitting its data best. ``cluster``: the index it chose
    last (-1 before its first choice)."""

    cluster: int = -1

    def cluster_losses(self, candidates: Sequence[Mapping[str, torch.Tensor]]) -> List[float]:
        """Mean cross-entropy on this client's training data (eval mode) of each candidate model (tensors
        by name, relative to the shared module). Leaves the last candidate loaded."""
        losses = []
        for candidate in candidates:
            self.set_parameters(candidate)
            total, count = self.train_metrics()
            losses.append(total / count if count else float("nan"))
        return losses

    def estimate_cluster(self, candidates: Sequence[Mapping[str, torch.Tensor]]) -> int:
        """The index of the candidate of lowest training loss (ties to the lower index), kept as ``cluster``.
        Measuring loads the candidates in turn: the last one is left loaded, for the server to replace with
        what the client receives (IFCA's payload: the chosen one)."""
        self.cluster = lowest_loss(self.cluster_losses(candidates)) if len(candidates) > 1 else 0
        return self.cluster

    def choose_cluster(self, candidates: Sequence[Mapping[str, torch.Tensor]]) -> int:
        """:meth:`estimate_cluster`, then load the chosen candidate; returns its index."""
        self.set_parameters(candidates[self.estimate_cluster(candidates)])
        return self.cluster
