"""FedPer's client (Arivazhagan et al., "Federated Learning with Personalization Layers", arXiv
1912.00818, 2019): exchanges only the feature extractor ``base``; the head never leaves the client.

Local training is plain SGD on base and head together, so the personal head adapts to each round's
freshly received base.
"""
from flcore.vmapped.support import PLAIN
from flcore.clients.clientbase import Client


class clientPer(Client):
    batched = PLAIN
    shared_path = "base"
