"""FedROD (Hong-You Chen and Wei-Lun Chao, "On Bridging Generic and Personalized Federated Learning
for Image Classification", ICLR 2022).

Shared: the whole generic model (base + generic head), trained on every client with the balanced
softmax loss (logits shifted by the log of the client's class counts) and averaged by sample count.
Local: a personal linear head on detached features, trained with cross-entropy on
``generic_logits + personal_logits``. No extra server step. Each client reports the received
generic model plus its personal head (PFLLIB.md section 6); the generic model alone on the same test
sets is recorded as ``rs_generic_test_acc`` (the paper's generic, G-FL, accuracy).
"""
from __future__ import annotations

from typing import Optional, Sequence

from flcore.aggregation import copy_into, named_tensors
from flcore.clients.clientbase import Client
from flcore.clients.clientrod import clientROD
from flcore.servers.serverbase import Server
from utils.metrics import Summary


class FedROD(Server):
    """New clients (-nnc): the global generic model and a fresh personal head, initialised as every
    training client's was (a copy of the initial generic head), then -ften epochs of FedROD's own local
    update (balanced softmax on the generic model, cross-entropy on the summed logits for the personal
    head); they report generic plus personal logits, as every client does."""
    client_class = clientROD

    def setup(self) -> None:
        # Where every personal head starts (clientROD copies the generic head it is built with). The
        # generic head moves with training, so newcomers take this copy; the same seed rebuilds it on resume.
        self.initial_personal_head = {n: t.detach().clone() for n, t in named_tensors(self.global_model.head).items()}

    def receive_new_client(self, client: clientROD) -> None:
        super().receive_new_client(client)
        copy_into(client.personal_head, self.initial_personal_head)

    def evaluate(self, clients: Optional[Sequence[Client]] = None, prefix: str = "rs") -> Summary:
        summary = super().evaluate(clients, prefix)
        clients = self.evaluation_clients() if clients is None else clients
        counts = [c.generic_test_accuracy() for c in self.in_use(clients)]
        self.record(f"{prefix}_generic_test_acc", sum(c for c, _ in counts) / max(sum(n for _, n in counts), 1))
        return summary
