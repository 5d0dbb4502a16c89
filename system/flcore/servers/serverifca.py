"""IFCA (Ghosh, Chung, Yin, Ramchandran, "An Efficient Framework for Clustered Federated Learning",
NeurIPS 2020): the Iterative Federated Clustering Algorithm, with model averaging.

The server keeps k cluster models (``-ncs``, default 4: the number of client groups assumed). Each round
every selected client estimates its cluster, the model of lowest loss on its own training data (ties to
the lower index), trains it for ``-ls`` epochs and uploads it with that index. The server replaces each
cluster's model by the sample-weighted average of its uploads; a cluster nobody chose keeps its model.
Every client is evaluated with the cluster model it would choose at that evaluation; the choices are
recorded as ``cluster_of_client``.

The cluster models start apart: cluster 0 from the run's initial model (so with ``-ncs 1`` IFCA is
FedAvg, bit for bit), cluster j > 0 from the same architecture drawn again by each layer's own
initialiser from the seeded stream (``--seed``, j), so runs are deterministic and the global generator
is untouched.

``--ifca_share_base`` is the paper's weight-sharing variant, off by default: the base (every layer but
the head) is one model, averaged over all uploads whatever their cluster, and only the heads are per
cluster (they start apart; the base starts as the run's initial one).

No ``X+LAG``: IFCA already personalises by cluster, each client taking one cluster model whole, so no
client keeps layers of its own for LAG to choose (the registry refuses it).
"""
from __future__ import annotations

import copy
from typing import Dict, List, Optional, Sequence

import torch
from torch import nn

from flcore.aggregation import State, named_tensors, weighted_average
from flcore.clients.clientifca import clientIFCA
from flcore.clients.parked_modules import frozen_copy_of
from flcore.exchange import ClientUpdate
from flcore.hyperparameters import IFCAParams
from flcore.servers.clusterserver import ClusterModelsServer
from utils.errors import ConfigError
from utils.seeding import model_seed

HEAD_PREFIX = "head."


def redrawn_state(module: nn.Module, seed: int) -> State:
    """The tensors of ``module`` with every layer initialised again by its own ``reset_parameters`` (or
    ``_reset_parameters``), drawn from torch's CPU generator seeded ``seed``; ``module`` itself and the
    global generator are left as they were. Drawn on the CPU, so the values do not depend on the device."""
    clone = copy.deepcopy(module).to("cpu")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for layer in clone.modules():
            reset = getattr(layer, "reset_parameters", None) or getattr(layer, "_reset_parameters", None)
            if callable(reset):
                reset()
    live = named_tensors(module)
    return {name: t.detach().to(live[name].device) for name, t in named_tensors(clone).items()}


class IFCA(ClusterModelsServer):
    """New clients (-nnc): the cluster model of lowest loss on their training data, then -ften epochs of
    plain cross-entropy fine-tuning."""
    client_class = clientIFCA
    persistent_attrs = ("cluster_models",)

    hparams: IFCAParams

    def setup(self) -> None:
        self.num_clusters = self.hparams.num_clusters
        self.share_base = self.hparams.share_base
        initial = self.initial_model_state()
        if self.share_base and not any(name.startswith(HEAD_PREFIX) for name in initial):
            raise ConfigError("--ifca_share_base needs a model split into base and head")
        self.cluster_models: List[State] = [initial] + [
            redrawn_state(self.global_shared_module(), model_seed(self.config.seed, j))
            for j in range(1, self.num_clusters)]
        if self.share_base:
            for state in self.cluster_models[1:]:
                state.update({name: initial[name].clone() for name in self.base_names()})
        self.chosen: Dict[int, int] = {}  # client id -> the cluster it chose this round

    def base_names(self) -> List[str]:
        """The tensors one model shares across clusters under ``--ifca_share_base`` (all but the head)."""
        return [name for name in self.cluster_models[0] if not name.startswith(HEAD_PREFIX)]

    def place(self, clients: Sequence[clientIFCA]) -> None:
        """Each client chooses its cluster model (on its own data, trying every candidate) and receives the one
        it chose as its :meth:`payload` (holding it from then on, this round)."""
        with self.sending():
            for client in self.in_use(clients):
                self.chosen[client.id] = client.estimate_cluster(self.cluster_models)
                client.set_parameters(self.payload(client.id))

    def payload(self, client_id: int) -> State:
        """The cluster model the client chose this round; the clients of a cluster share one frozen copy."""
        cluster = self.chosen[client_id]
        return self._sent_once(("cluster", cluster), lambda: frozen_copy_of(self.cluster_models[cluster],
                                                                           self.client_class.shared_path))

    def send_models(self) -> None:
        """The selected clients try every cluster model and receive the one they choose."""
        self.chosen = {}
        self.place(self.selected_clients)

    def evaluate(self, clients=None, prefix: str = "rs", model_of=None):
        """Clients that did not choose yet this round choose now, so each is evaluated with its choice."""
        if prefix == "rs":
            measured = self.evaluation_clients() if clients is None else clients
            self.place([c for c in measured if c.id not in self.chosen])
        return super().evaluate(clients, prefix, model_of)

    def cluster_assignment(self) -> List[int]:
        return [self.chosen.get(c.id, -1) for c in self.clients]

    def extras_problem(self, update: ClientUpdate) -> Optional[str]:
        cluster = update.extras.get("cluster")
        if isinstance(cluster, bool) or not isinstance(cluster, int) or not 0 <= cluster < self.num_clusters:
            return f"its cluster index {cluster!r} is not one of 0 .. {self.num_clusters - 1}"
        return None

    def aggregate_parameters(self) -> None:
        if not self.uploads:
            return
        self.average_into_clusters(self.uploads, [u.extras["cluster"] for u in self.uploads])
        if self.share_base:
            names = self.base_names()
            base = weighted_average([u.tensors for u in self.uploads], self.upload_weights, names)
            for state in self.cluster_models:
                state.update({name: base[name].clone() for name in names})
