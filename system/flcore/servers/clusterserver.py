"""A server that keeps one model per cluster of clients (IFCA, CFL).

``cluster_models`` holds them as tensors by name (relative to the clients' shared module, here the whole
model), on the server's device: each method's persistent state, with what it adds. A client receives the
model of its cluster as its payload (``Server.payload``: the clients of a cluster share one frozen copy),
trains it and is evaluated with it. Every evaluation records each client's cluster
in ``cluster_of_client`` (evaluations x clients, int), so that a study can compare the clusters with
the true groups (e.g. the adjusted Rand index). The base server's ``global_model`` is never trained:
it keeps the run's initial model, which the first cluster model starts from. A new client (-nnc) takes
the cluster model of lowest loss on its training data, then fine-tunes it as usual.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

from torch import nn

from flcore.aggregation import State, named_tensors
from flcore.clustering import group_averages
from flcore.exchange import ClientUpdate
from flcore.servers.serverbase import Server
from flcore.training.cluster_choice import ClusterChoosingClient
from utils.metrics import Summary

CLUSTER_RECORD = "cluster_of_client"


class ClusterModelsServer(Server):
    cluster_models: List[State]

    def initial_model_state(self) -> State:
        """A copy of the run's initial model (what the global shared module holds at the start)."""
        return {name: t.detach().clone() for name, t in named_tensors(self.global_shared_module()).items()}

    def cluster_assignment(self) -> List[int]:
        """Each training client's cluster now, in client order."""
        raise NotImplementedError

    def evaluate(self, clients: Optional[Sequence[ClusterChoosingClient]] = None, prefix: str = "rs",
                 model_of: Optional[Callable[[ClusterChoosingClient], nn.Module]] = None) -> Summary:
        if prefix == "rs":
            self.record(CLUSTER_RECORD, list(self.cluster_assignment()))
        return super().evaluate(clients, prefix, model_of)

    def average_into_clusters(self, uploads: Sequence[ClientUpdate], clusters: Sequence[int]) -> None:
        """Replace the model of each cluster that has uploads by their sample-weighted average (weights
        normalised within the cluster); a cluster without uploads keeps its model."""
        averages = group_averages([u.tensors for u in uploads], clusters, [u.num_samples for u in uploads])
        for cluster, state in averages.items():
            self.cluster_models[cluster] = state

    def receive_new_client(self, client: ClusterChoosingClient) -> None:
        """The cluster model of lowest loss on the newcomer's training data."""
        client.choose_cluster(self.cluster_models)
