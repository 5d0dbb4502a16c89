"""FedProx (Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, "Federated Optimization in Heterogeneous
Networks", MLSys 2020).

Everything is shared and averaged with FedAvg's sample weights (the paper's analysis samples
clients in proportion to their size and takes a plain mean; with uniform sampling, as here and in
the authors' experiments, sample weights are the usual counterpart). The only change is the
client's proximal term ``mu/2 * ||w - w_global||^2`` (``-mu``, default 0, which is FedAvg).
Each client reports the received global model.
"""
from flcore.clients.clientprox import clientProx
from flcore.servers.serverbase import Server


class FedProx(Server):
    """New clients (-nnc): the global model, then -ften epochs of plain cross-entropy fine-tuning (no
    proximal term)."""
    client_class = clientProx
