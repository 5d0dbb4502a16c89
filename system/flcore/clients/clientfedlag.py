"""FedLAG's client: FedAvg's local SGD. FedLAG changes only what the server broadcasts and keeps,
so the client needs nothing of its own; the class exists for PFLlib's file naming."""
from flcore.vmapped.support import PLAIN
from flcore.clients.clientavg import clientAVG


class clientFedLAG(clientAVG):
    batched = PLAIN
