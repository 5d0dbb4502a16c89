"""FedLAG (Nguyen et al., "Towards Layer-Wise Personalized Federated Learning: Adaptive Layer
Disentanglement via Conflicting Gradients", arXiv 2410.02845).

Every round the server scores each layer by how many client pairs updated it in conflicting
directions (cosine below ``--lag_xi``), keeps the ``--lag_top_k`` most conflicting layers personal on
every client and averages the rest as FedAvg does. ``-algo FedLAG`` is ``-algo FedAvg+LAG``; the
mechanism lives in :mod:`flcore.lag`, so any other parameter-sharing algorithm gets it as ``X+LAG``.
"""
from flcore.clients.clientfedlag import clientFedLAG
from flcore.lag.mixin import LayerConflictMixin
from flcore.servers.serveravg import FedAvg


class FedLAG(LayerConflictMixin, FedAvg):
    client_class = clientFedLAG
