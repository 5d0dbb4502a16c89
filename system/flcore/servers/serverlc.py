"""FedLC (Zhang, Li, Li, Xu, Wu, Ding, Wu, "Federated Learning with Label Distribution Skew via
Logits Calibration", ICML 2022).

Everything is shared and averaged with FedAvg's sample weights. Clients train with cross-entropy on
logits calibrated by their *own* class counts, ``f(x)_c - tau * n_c^(-1/4)`` (``-tau``, default 1;
0 is FedAvg), as the paper defines it; PFLlib calibrates with the class counts summed over all
clients, the same offset on every client, which corrects the global label imbalance but not each
client's own skew.
Each client reports the received global model with raw logits.
"""
from flcore.clients.clientlc import clientLC
from flcore.servers.serverbase import Server


class FedLC(Server):
    """New clients (-nnc): the global model, then -ften epochs of plain cross-entropy fine-tuning on raw
    logits (the calibration only corrects label skew while a shared model is trained)."""
    client_class = clientLC
