"""FedNTD (Lee, Jeong, Shin, Yun, "Preservation of the Global Knowledge by Not-True Distillation in
Federated Learning", NeurIPS 2022).

Everything is shared. Clients add ``beta * tau^2 * KL`` between the not-true-class softmaxes of the
received global model and the local model (``-bt`` beta, default 0, which is FedAvg; the paper uses
1; ``-tau``, default 1). The server averages with FedAvg's sample weights, as the authors' code does
(PFLlib uses a uniform 1/num_join mean). Each client reports the received global model.
"""
from flcore.clients.clientntd import clientNTD
from flcore.servers.serverbase import Server


class FedNTD(Server):
    """New clients (-nnc): the global model, then -ften epochs of plain cross-entropy fine-tuning (no
    distillation)."""
    client_class = clientNTD
