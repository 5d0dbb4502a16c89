"""Local: every client trains its own model on its own data; nothing is sent or averaged.

The reference point every personalised method must beat (PFLlib issue #243 asks for it in tables).
"""
from flcore.clients.clientlocal import clientLocal
from flcore.servers.serverbase import Server


class Local(Server):
    client_class = clientLocal

    def send_models(self) -> None:
        pass

    def receive_models(self) -> None:
        self.uploaded_ids, self.uploaded_weights, self.uploaded_models = [], [], []

    def aggregate_parameters(self) -> None:
        pass
