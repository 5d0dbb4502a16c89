"""Ditto's client (Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021).

``model`` is the global model w: trained with plain cross-entropy as in FedAvg and uploaded.
``model_per`` is the personal model v, never uploaded nor overwritten: each round it takes ``-pls``
epochs of SGD on ``CE(v) + mu/2 * ||v - w^t||^2`` (``-mu``), where w^t is the model received this
round. The personal model is what the client reports; the server also reports w under its own name.
"""
from __future__ import annotations

import copy

import torch

from flcore.aggregation import copy_into, named_tensors
from flcore.vmapped.support import Refused
from flcore.clients.clientbase import Client
from flcore.hyperparameters import DittoParams
from flcore.training.personal import State, squared_distance_to


class clientDitto(Client):
    batched = Refused("it trains a second, personal model for -pls epochs before the shared one")
    persistent_attrs = ("model_per", "optimizer_per", "learning_rate_scheduler_per")

    hparams: DittoParams

    def setup(self) -> None:
        self.mu = self.hparams.pull_weight
        self.plocal_epochs = self.hparams.personal_epochs
        self.model_per = copy.deepcopy(self.model)
        self.optimizer_per = self.make_optimizer(self.model_per.parameters())
        self.learning_rate_scheduler_per = self.make_scheduler(self.optimizer_per)
        self.received: State = {}          # w^t, refreshed every round

    def begin_local_training(self) -> None:
        # The personal step needs w^t, so it runs before w itself moves (PFLlib's order too).
        self.train_personal(self.plocal_epochs)

    def train_personal(self, epochs: int) -> None:
        # w^t held by reference, not copied (a model's worth less at the round's peak): w does not move
        # while v trains, since only v's optimiser steps here and w trains afterwards.
        self.received = {name: param.detach() for name, param in self.model.named_parameters()}
        self.model_per.train()
        self.run_epochs(epochs, self.personal_loss, self.optimizer_per)
        for param in self.model_per.parameters():  # v's gradients are spent; w's training follows
            param.grad = None
        if self.learning_rate_decay:
            self.learning_rate_scheduler_per.step()
        self.received = {}  # w^t is needed only here: a client keeps no copy of the model between rounds

    def personal_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = self.loss(self.model_per(x), y)
        if self.mu == 0:
            return loss
        return loss + 0.5 * self.mu * squared_distance_to(self.model_per, self.received)

    def fine_tune(self, epochs: int) -> None:
        """A new client personalises the received global model with Ditto's own objective: its personal
        model starts as that global model (it has none of its own yet)."""
        copy_into(self.model_per, named_tensors(self.model))
        self.train_personal(epochs)

    def evaluation_model(self) -> torch.nn.Module:
        """The personal model v (the server also measures the global model w, by name)."""
        return self.model_per
