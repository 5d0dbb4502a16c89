"""LG-FedAvg (Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov, Morency, "Think Locally,
Act Globally: Federated Learning with Local and Global Representations", arXiv 2001.01523, 2020).

Shared: the head (the global model is the classifier only), averaged by sample count. Local: the
base, each client's own representation, never uploaded. No extra loss and no extra server step;
each client is evaluated with its own base and the received head.
"""
from flcore.clients.clientlg import clientLG
from flcore.servers.serverbase import Server


class LG_FedAvg(Server):
    """New clients (-nnc): the global head and a fresh base (the initial base every training client
    started from; the server never averages bases), then -ften epochs of cross-entropy on base and head
    together, as LG-FedAvg trains."""
    client_class = clientLG
