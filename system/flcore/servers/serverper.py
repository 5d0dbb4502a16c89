"""FedPer (Arivazhagan, Aggarwal, Singh, Choudhary, "Federated Learning with Personalization
Layers", arXiv 1912.00818, 2019).

Shared: the base (feature extractor), averaged by sample count as in FedAvg. Local: the
classifier head, trained jointly with the base and never uploaded. No extra loss and no extra
server step; each client is evaluated with the received base and its own head.
"""
from flcore.clients.clientper import clientPer
from flcore.servers.serverbase import Server


class FedPer(Server):
    """New clients (-nnc): the global base and a fresh head (the initial head every training client
    started from; the server never averages heads), then -ften epochs of cross-entropy on base and head
    together, as FedPer trains."""
    client_class = clientPer
