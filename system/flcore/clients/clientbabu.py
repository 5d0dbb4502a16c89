"""FedBABU's client (Oh, Kim, Yun, "FedBABU", ICLR 2022): during federated training only the body
(``base``) is trained and exchanged; the head stays at its initial value, which is the same on
every client. ``fine_tune`` then trains body and head together.
"""
from __future__ import annotations

from torch import nn

from flcore.algorithm_flags import Hyperparameters
from flcore.clients.clientbase import Client
from flcore.training.parttraining import fine_tune_whole_model, part_optimizer
from utils.data_utils import ClientData
from utils.run_config import RunConfig


class clientBABU(Client):
    shared_path = "base"

    def __init__(self, config: RunConfig, hparams: Hyperparameters, id: int, train_data: ClientData,
                 test_data: ClientData, model: nn.Module):
        super().__init__(config, hparams, id, train_data, test_data, model)
        # The optimiser cannot reach the head, and freezing it also skips its gradients.
        self.model.head.requires_grad_(False)
        self.optimizer, self.learning_rate_scheduler = part_optimizer(self, self.model.base)

    def fine_tune(self, epochs: int) -> None:
        """Personalisation after federated training: body and head, then the head is frozen again."""
        fine_tune_whole_model(self, epochs)
