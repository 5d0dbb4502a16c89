"""FedAvg (McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized
Data", AISTATS 2017): clients train locally, the server takes the sample-weighted average.

Everything FedAvg does is the base round loop.
"""
from flcore.clients.clientavg import clientAVG
from flcore.servers.serverbase import Server


class FedAvg(Server):
    """New clients (-nnc): the global model, then -ften epochs of plain cross-entropy fine-tuning."""
    client_class = clientAVG
