"""LG-FedAvg's client (Liang et al., "Think Locally, Act Globally", 2020): exchanges only the
classifier ``head``; the feature extractor ``base`` is the client's local representation.

Local training is plain SGD on base and head together.
"""
from flcore.vmapped.support import PLAIN
from flcore.clients.clientbase import Client


class clientLG(Client):
    batched = PLAIN
    shared_path = "head"
