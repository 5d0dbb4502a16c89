"""CFL's client (Sattler, Mueller, Samek, "Clustered Federated Learning: Model-Agnostic Distributed
Multitask Optimization Under Privacy Constraints", IEEE TNNLS 2020).

It trains its cluster's model with plain local SGD and uploads it; the server reads the update
``dW_i`` as the upload minus the model it sent. It chooses a cluster itself, by lowest training loss,
only when it missed the round its cluster split in, and as a newcomer (``-nnc``).
"""
from flcore.training.cluster_choice import ClusterChoosingClient
from flcore.vmapped.support import PLAIN


class clientCFL(ClusterChoosingClient):
    batched = PLAIN
