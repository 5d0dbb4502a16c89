"""PFL-DA's client ("Personalized Federated Learning via Domain Adaptation with an Application to Distributed
3D Printing", Technometrics 2023).

``model.base`` is the client's own encoder Phi_i; ``model.head`` is its copy of the global head g, received
and uploaded every round; ``personal_head`` (h_i) never leaves the client. Each minibatch takes one step of
each of, with one backward pass::

    Phi_i, g  on  CE(g(Phi_i(x)), y)                                the encoder learns to serve the global head
    h_i       on  CE(h_i(Phi_i(x).detach()), y) + lamda/2 ||h_i - g_r||^2    g_r: the head received this round

The encoder adapts the client's inputs to the space the shared head reads (the covariate shift), the
personal head corrects the global one on this client (the concept shift). The client reports
``h_i(Phi_i(x))``.
"""
from __future__ import annotations

import copy
from typing import Optional

import torch
from torch import nn

from flcore.aggregation import copy_into, named_tensors
from flcore.clients.clientbase import Client
from flcore.hyperparameters import PFLDAParams
from flcore.training.personal import parameter_views, squared_distance_to
from flcore.training.received import frozen_copy
from flcore.trainmodel.models import BaseHeadSplit
from flcore.vmapped.support import Refused


class clientDA(Client):
    batched = Refused("every step also trains the personal head, on the encoder's detached features, with "
                      "its own optimiser")
    shared_path = "head"
    persistent_attrs = ("personal_head", "personal_optimizer", "personal_scheduler")
    personal_layer_attrs = ("personal_head",)  # FedLAG's K counts it (flcore/lag/mixin.py)

    hparams: PFLDAParams

    def setup(self) -> None:
        self.lamda = self.hparams.head_pull
        # As every training client's: a copy of the initial head (the initial global head too).
        self.personal_head = copy.deepcopy(self.model.head)
        self.personal_optimizer = self.make_optimizer(self.personal_head.parameters())
        self.personal_scheduler = self.make_scheduler(self.personal_optimizer)
        self.received_head: Optional[nn.Module] = None  # g_r, only while training

    def begin_local_training(self) -> None:
        self.received_head = frozen_copy(self.model.head)
        self.personal_head.train()

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        features = self.model.base(x)
        shared_loss = self.loss(self.model.head(features), y)
        # Detached features: the personal head's loss moves the personal head only, and the encoder and
        # the global head get exactly the shared loss's gradient.
        personal_loss = self.loss(self.personal_head(features.detach()), y)
        if self.lamda:
            anchor = parameter_views(self.received_head)
            personal_loss = personal_loss + 0.5 * self.lamda * squared_distance_to(self.personal_head, anchor)
        return shared_loss + personal_loss

    def after_step(self) -> None:
        self.personal_optimizer.step()
        self.personal_optimizer.zero_grad(set_to_none=True)

    def end_local_training(self) -> None:
        if self.learning_rate_decay:
            self.personal_scheduler.step()
        self.received_head = None

    def fine_tune(self, epochs: int) -> None:
        """A new client: its personal head starts as the global head it received (it has none of its own),
        then PFL-DA's own local update, encoder and heads together."""
        copy_into(self.personal_head, named_tensors(self.model.head))
        self.model.train()
        self.begin_local_training()
        self.run_epochs(epochs, self.local_loss)
        self.received_head = None

    def evaluation_model(self) -> nn.Module:
        """The client's encoder with its personal head (the global head is not reported)."""
        return BaseHeadSplit(self.model.base, self.personal_head)
