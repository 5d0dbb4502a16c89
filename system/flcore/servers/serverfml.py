"""FML (Shen, Zhang, Jia, Zhang, Huang, Zhou, Kuang, Wu, Wu, "Federated Mutual Learning", arXiv
2006.16765, 2020).

Shared: the meme model, averaged with FedAvg's sample weights. Local: each client's local model, trained
with the meme model by deep mutual learning (see ``clientfml``) and never uploaded. Reported: the local
models (``rs_test_acc``); the global meme model on the same clients is ``rs_global_test_acc``.

As in PFLlib the local model has the meme model's architecture (``-m``) and starts from the same initial
weights (the paper allows any local architecture). PFLlib's shared defaults ``-al 1 -bt 0`` leave the local
model out of the mutual learning (Local training); left out here, they take the paper's 0.5 and 0.5.
"""
from flcore.clients.clientfml import clientFML
from flcore.servers.privatemodelserver import PrivateModelServer


class FML(PrivateModelServer):
    """New clients (-nnc): the global meme model and a fresh local model (the initial model every training
    client's local model started from), then -ften epochs of FML's mutual learning; the local model is
    tested."""
    client_class = clientFML
