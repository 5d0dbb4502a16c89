"""FedAvg's client: plain local SGD on cross-entropy; everything is shared (the base behaviour)."""
from flcore.vmapped.support import PLAIN
from flcore.clients.clientbase import Client


class clientAVG(Client):
    batched = PLAIN
