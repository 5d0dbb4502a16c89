"""FedBABU's client (Oh, Kim, Yun, "FedBABU", ICLR 2022): during federated training only the body
(``base``) is trained and exchanged; the head stays at its initial value, which is the same on
every client. ``fine_tune`` then trains body and head together.
"""
from __future__ import annotations

from flcore.vmapped.support import PLAIN
from flcore.clients.clientbase import Client
from flcore.training.parttraining import fine_tune_whole_model, part_optimizer


class clientBABU(Client):
    batched = PLAIN  # its optimiser holds the body only: the head stays frozen
    shared_path = "base"

    def setup(self) -> None:
        # The optimiser cannot reach the head, and freezing it also skips its gradients.
        self.model.head.requires_grad_(False)
        self.optimizer, self.learning_rate_scheduler = part_optimizer(self, self.model.base)

    def fine_tune(self, epochs: int) -> None:
        """Personalisation after federated training: body and head, then the head is frozen again."""
        fine_tune_whole_model(self, epochs)
