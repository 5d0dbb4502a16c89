"""FD, Federated Distillation (Jeong, Oh, Kim, Park, Bennis, Kim, "Communication-Efficient On-Device
Machine Learning: Federated Distillation and Augmentation under Non-IID Private Data", NeurIPS 2018
workshop on Machine Learning on the Phone and other Consumer Devices; arXiv 1811.11479).

No parameters are shared: every client keeps its whole model. During local training each client
averages its logits per label; the server's global logit of a label is the unweighted mean over the
clients that hold the label and is sent to every client, which adds
``lamda * KL(softmax(global logit of y) || softmax(model(x)))`` to its cross-entropy. Each client is
evaluated on its own model. ``FD+LAG`` is refused: there are no shared layers.
"""
from flcore.clients.clientfd import clientFD
from flcore.servers.classvectorserver import ClassVectorServer


class FD(ClassVectorServer):
    """New clients (-nnc): no parameters (their fresh model is the initial model every training client
    started from) and the global average logits, which they distil from for -ften epochs with FD's own loss
    (cross-entropy plus -lam times the KL to the global logit of each label)."""
    client_class = clientFD

    def vector_dim(self) -> int:
        return int(self.num_classes)
