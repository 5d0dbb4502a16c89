"""CFL (Sattler, Mueller, Samek, "Clustered Federated Learning: Model-Agnostic Distributed Multitask
Optimization Under Privacy Constraints", IEEE TNNLS 2020).

Training starts as FedAvg, with one cluster of all clients. Each round a cluster's selected clients train
from its model and upload; the server reads each update ``dW_i`` as the upload minus the model it sent,
and the cluster's model moves by the sample-weighted mean of its members' updates (computed as the
sample-weighted average of their uploads, the same in exact arithmetic: with no split CFL is FedAvg,
bit for bit). A cluster splits when its clients have jointly reached a stationary point that is not one
for each of them (:class:`~flcore.clustering.SplitRule`): the norm of the mean update is below
``--cfl_eps1``, some client's update norm is above ``--cfl_eps2``, at least 3 clients uploaded, and
the round is past the ``--cfl_warmup`` rounds. Its uploaders are then cut in two by the cosine
similarity of their updates (:func:`~flcore.clustering.bipartition`). The authors' code computes the
paper's optimal bipartition (the one whose largest similarity across the parts is smallest) with
complete-linkage agglomerative clustering; the two differ: single linkage gives that optimum, complete
linkage keeps the parts compact instead. ``--cfl_linkage`` chooses; the default is the authors' complete
linkage. Both children start from the parent's model and, as in the authors' code, each moves
at once by the mean update of its own members (the parent's other updates point elsewhere: that is why
it split), so the two differ from the round they are made.

Defaults, measured on ``-data Digits-iid-lg4 -nc 40 -lr 0.05`` (CNN, one local epoch): ``--cfl_eps1 0.05
--cfl_eps2 0.3 --cfl_warmup 20``. The authors' published code uses eps1 = 0.4, eps2 = 1.6 and 20 rounds
of warm-up with its own model and learning rate; here, past round 20, client update norms stay near
0.7-0.8, below 1.6, and CFL would stay FedAvg. The norms scale with the model, ``-lr`` and ``-ls``, so other settings need their own
values: every cluster's norms of every round are recorded (``cfl_update_norms``) to choose them from.

Partial participation (``-jr`` < 1; the paper assumes every client takes part): a client of the
splitting cluster that did not upload in that round (not selected, dropped, or its update refused)
joins, at the split, the child whose model has the lower loss on its own training data. The children's
models do not change before the next round's uploads, so waiting for the client's next round would give
the same child; deciding at once leaves no client without a cluster at any evaluation and no undecided
state to carry across rounds.

Recorded: ``cluster_of_client`` (evaluations x clients), ``cfl_split_rounds`` (the round of each split),
``cfl_update_norms`` (one row per cluster with uploads per round: round, cluster, uploads, mean-update
norm, largest update norm) and the ``cfl_splits`` attribute (each split's round, clusters, uploaders of
each part, norms and largest cross similarity). A split keeps the parent's index for the part holding
its lowest-id uploader and gives the other part the next free index.

No ``X+LAG``: CFL already personalises by cluster, each client taking its cluster's model whole, so no
client keeps layers of its own for LAG to choose (the registry refuses it).
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

from flcore.aggregation import State, sample_weights
from flcore.clients.parked_modules import frozen_copy_of
from flcore.clients.clientcfl import clientCFL
from flcore.clustering import (SplitRule, bipartition, cosine_matrix, largest_cross_similarity,
                               max_update_norm, mean_update_norm, update_gram)
from flcore.exchange import ClientUpdate
from flcore.hyperparameters import CFLParams
from flcore.servers.clusterserver import ClusterModelsServer


class CFL(ClusterModelsServer):
    """New clients (-nnc): the cluster model of lowest loss on their training data, then -ften epochs of
    plain cross-entropy fine-tuning."""
    client_class = clientCFL
    persistent_attrs = ("cluster_models", "cluster_of", "splits", "update_norms")

    hparams: CFLParams

    def setup(self) -> None:
        self.rule = SplitRule(self.hparams.mean_norm_below, self.hparams.max_norm_above, self.hparams.warmup_rounds)
        self.cluster_models: List[State] = [self.initial_model_state()]
        self.cluster_of: List[int] = [0] * len(self.clients)
        self.splits: List[dict] = []
        self.update_norms: List[List[float]] = []

    def cluster_assignment(self) -> List[int]:
        return list(self.cluster_of)

    def payload(self, client_id: int) -> State:
        """Its cluster's model: every client receives one at ``send_models`` (as the base server sends to all),
        the clients of a cluster one frozen copy of it."""
        cluster = self.cluster_of[client_id]
        return self._sent_once(("cluster", cluster), lambda: frozen_copy_of(self.cluster_models[cluster],
                                                                           self.client_class.shared_path))

    def aggregate_parameters(self) -> None:
        """Per cluster with uploads, in index order: its norms, then either its new model or its split."""
        if not self.uploads:
            return
        names = [name for name, _ in self.global_shared_module().named_parameters()]
        clusters = [self.cluster_of[u.client_id] for u in self.uploads]
        for cluster in sorted(set(clusters)):
            members = [u for u, c in zip(self.uploads, clusters) if c == cluster]
            gram = update_gram([u.tensors for u in members], self.cluster_models[cluster], names)
            mean_norm = mean_update_norm(gram, sample_weights([u.num_samples for u in members]))
            max_norm = max_update_norm(gram)
            self.update_norms.append([float(self.current_round), float(cluster), float(len(members)), mean_norm,
                                      max_norm])
            if self.rule.due(self.current_round, len(members), mean_norm, max_norm):
                self.split(cluster, members, cosine_matrix(gram), mean_norm, max_norm)
            else:
                self.average_into_clusters(members, [cluster] * len(members))

    def split(self, cluster: int, members: Sequence[ClientUpdate], similarity: np.ndarray, mean_norm: float,
              max_norm: float) -> None:
        """Cut ``cluster`` in two by its uploaders' update similarities; each part's model is the parent's moved
        by its own members' mean update, and the parent's other clients join the part that fits them best."""
        first, second = bipartition(similarity, self.hparams.linkage)
        child = len(self.cluster_models)
        self.cluster_models.append({})
        parts = {cluster: [members[i] for i in first], child: [members[i] for i in second]}
        for part, uploads in parts.items():
            self.average_into_clusters(uploads, [part] * len(uploads))
            for update in uploads:
                self.cluster_of[update.client_id] = part
        uploaders = {u.client_id for u in members}
        stayed = [c for c in self.clients if self.cluster_of[c.id] == cluster and c.id not in uploaders]
        for client in self.in_use(stayed):  # each tries both parts on its own data
            self.cluster_of[client.id] = (cluster, child)[client.choose_cluster(
                [self.cluster_models[cluster], self.cluster_models[child]])]
        self.splits.append({"round": self.current_round, "cluster": cluster, "new_cluster": child,
                            "uploaders": [[u.client_id for u in uploads] for uploads in parts.values()],
                            "mean_norm": mean_norm, "max_norm": max_norm,
                            "largest_cross_similarity": largest_cross_similarity(similarity, first, second)})

    def result_arrays(self) -> Dict[str, np.ndarray]:
        arrays = super().result_arrays()
        arrays["cfl_split_rounds"] = np.array([s["round"] for s in self.splits], dtype=np.int64)
        arrays["cfl_update_norms"] = np.array(self.update_norms, dtype=np.float64).reshape(-1, 5)
        return arrays

    def result_attrs(self) -> Dict[str, object]:
        attrs = super().result_attrs()
        attrs["cfl_splits"] = list(self.splits)
        return attrs
