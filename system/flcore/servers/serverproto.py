"""FedProto (Tan, Long, Liu, Zhou, Lu, Jiang, Zhang, "FedProto: Federated Prototype Learning across
Heterogeneous Clients", AAAI 2022).

No parameters are shared: every client keeps its whole model. Clients upload class prototypes (the
mean feature ``base(x)`` of each class they hold); the server's global prototype of a class is the
unweighted mean over the clients that hold it (as in the paper: each client counts once) and is
sent to every client. Clients add ``lamda * MSE(base(x), global prototype of y)`` to their loss and
classify by the nearest global prototype. ``FedProto+LAG`` is refused: there are no shared layers.
"""
from flcore.clients.clientproto import clientProto
from flcore.servers.classvectorserver import ClassVectorServer


class FedProto(ClassVectorServer):
    """New clients (-nnc): no parameters (their fresh model is the initial model every training client
    started from) and the global prototypes, which they train towards for -ften epochs with FedProto's own
    loss (cross-entropy plus -lam times the distance to the global prototype of each label) and are then
    classified by, as every FedProto client is; for a class no training client holds (so without a global
    prototype) a newcomer uses its own prototype, as the global one would be had it been a holder."""
    client_class = clientProto

    def vector_dim(self) -> int:
        return int(self.global_model.head.in_features)
