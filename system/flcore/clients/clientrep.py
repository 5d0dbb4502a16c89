"""FedRep's client (Collins et al., "Exploiting Shared Representations for Personalized Federated
Learning", ICML 2021): each round, ``-pls`` epochs on the head with the base frozen, then ``-ls``
epochs on the base with the head frozen; only the base is exchanged.
"""
from __future__ import annotations

from flcore.vmapped.support import HEAD_THEN_BASE
from flcore.clients.clientbase import Client
from flcore.hyperparameters import FedRepParams
from flcore.training.parttraining import only_trainable, part_optimizer, train_head_then_base


class clientRep(Client):
    batched = HEAD_THEN_BASE
    shared_path = "base"
    persistent_attrs = ("head_optimizer", "head_scheduler")

    hparams: FedRepParams

    def setup(self) -> None:
        self.head_epochs = self.hparams.head_epochs
        # One optimiser per stage, so a stage can only ever step the part it trains.
        self.optimizer, self.learning_rate_scheduler = part_optimizer(self, self.model.base)
        self.head_optimizer, self.head_scheduler = part_optimizer(self, self.model.head)

    def local_training(self) -> None:
        train_head_then_base(self, self.head_epochs, self.local_loss, self.local_loss)

    def fine_tune(self, epochs: int) -> None:
        """A new client: FedRep's two stages with ``epochs`` each, the head first (base frozen), then the
        base (head frozen), each with its own optimiser; no learning-rate decay step."""
        self.model.train()
        with only_trainable(self.model, self.model.head):
            self.run_epochs(epochs, self.local_loss, self.head_optimizer)
        with only_trainable(self.model, self.model.base):
            self.run_epochs(epochs, self.local_loss, self.optimizer)
