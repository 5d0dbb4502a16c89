"""Local: every client trains its own model on its own data; nothing is sent or averaged.

The reference point every personalised method must beat (PFLlib issue #243 asks for it in tables).
"""
from flcore.clients.clientlocal import clientLocal
from flcore.servers.serverbase import Server


class Local(Server):
    """New clients (-nnc): nothing from the server; a fresh model (the initial model every training client
    started from) trained alone for -ften epochs of plain cross-entropy on their own data."""
    client_class = clientLocal

    def send_models(self) -> None:
        pass

    def receive_models(self) -> None:
        self.uploads, self.upload_weights = [], []

    def aggregate_parameters(self) -> None:
        pass

    def receive_new_client(self, client) -> None:
        pass  # nothing from the server: the initial model, trained alone
