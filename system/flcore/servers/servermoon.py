"""MOON (Li, He, Song, "Model-Contrastive Federated Learning", CVPR 2021).

Everything is shared and averaged with FedAvg's sample weights, as in the paper. The client adds
``mu * l_con`` (``-mu``, default 0, which is FedAvg; the paper uses 1 or 5) with temperature
``-tau`` (default 1; the paper uses 0.5): the features ``base(x)`` are pulled towards the received
global model's and pushed from the client's previous local model's. Each client reports the
received global model.
"""
from flcore.clients.clientmoon import clientMOON
from flcore.servers.serverbase import Server


class MOON(Server):
    """New clients (-nnc): the global model, then -ften epochs of plain cross-entropy fine-tuning (a
    newcomer has no previous local model for the contrastive term)."""
    client_class = clientMOON
