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
    """New clients (-nnc): the global model, the layers LAG keeps personal included (a newcomer has no
    copy of its own, so it takes the server's average of them), then -ften epochs of plain cross-entropy
    fine-tuning; every X+LAG treats newcomers as X does, with the same rule for its LAG-personal layers."""
    client_class = clientFedLAG
