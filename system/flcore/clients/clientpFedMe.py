"""pFedMe's client (T. Dinh, Tran, Nguyen, "Personalized Federated Learning with Moreau Envelopes",
NeurIPS 2020).

``model`` is the client's local copy w of the global model (shared, uploaded); ``model_per`` is the
personalised model theta (private). For every minibatch, theta takes ``-K`` SGD steps (lr ``-lrp``) on
``CE(theta) + lamda/2 * ||theta - w||^2`` (``-lam``), approximating the Moreau-envelope minimiser, and
then w moves towards it: ``w <- w - lr * lamda * (w - theta)``. theta starts each round from the
received w and is what the client reports.
"""
from __future__ import annotations

import copy

import torch

from flcore.aggregation import copy_into
from flcore.vmapped.support import Refused
from flcore.clients.clientbase import Client
from flcore.hyperparameters import PFedMeParams
from flcore.training.personal import State, parameter_views, run_batch_steps, squared_distance_to


class clientpFedMe(Client):
    batched = Refused("every minibatch takes -K inner steps on a personal model, then moves the local model")
    persistent_attrs = ("model_per", "optimizer_per", "learning_rate_scheduler_per")

    hparams: PFedMeParams

    def setup(self) -> None:
        self.lamda = self.hparams.moreau_weight
        self.K = self.hparams.inner_steps
        self.model_per = copy.deepcopy(self.model)
        self.optimizer_per = torch.optim.SGD(self.model_per.parameters(), lr=self.hparams.personal_learning_rate)
        self.learning_rate_scheduler_per = self.make_scheduler(self.optimizer_per)
        self.anchor: State = {}  # live views of w: the prox centre follows w's in-place updates

    def local_training(self) -> None:
        self.local_update(self.local_epochs)
        if self.learning_rate_decay:
            self.learning_rate_scheduler.step()
            self.learning_rate_scheduler_per.step()

    def local_update(self, epochs: int) -> None:
        self.model.train()
        self.model_per.train()
        copy_into(self.model_per, dict(self.model.named_parameters()))  # warm start from the received w
        self.anchor = parameter_views(self.model)
        run_batch_steps(self, epochs, self.batch_size, self.batch_step)
        self.anchor = {}
        # w never runs forward, so its BatchNorm statistics are theta's (as in PFLlib).
        copy_into(self.model, dict(self.model_per.named_buffers()))

    def batch_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for _ in range(self.K):
            loss = self.personal_step(x, y)
        self.pull_local_model()
        return loss

    def personal_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One SGD step of theta on ``CE(theta) + lamda/2 * ||theta - w||^2`` (w held fixed)."""
        loss = self.loss(self.model_per(x), y) + 0.5 * self.lamda * squared_distance_to(self.model_per, self.anchor)
        self.optimizer_per.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer_per.step()
        return loss.detach()

    @torch.no_grad()
    def pull_local_model(self) -> None:
        """``w <- w - lr * lamda * (w - theta)``, as an SGD step whose gradient is ``lamda * (w - theta)``.

        Going through the optimiser applies ``-ld`` decay, and leaves in ``w.grad`` the direction of
        this batch's update (what ``--lag_signal last_batch`` reads).
        """
        theta = parameter_views(self.model_per)
        for name, w in self.model.named_parameters():
            w.grad = self.lamda * (w - theta[name])
        self.optimizer.step()

    def fine_tune(self, epochs: int) -> None:
        """A new client computes its personalised theta with pFedMe's own local update."""
        self.local_update(epochs)

    def evaluation_model(self) -> torch.nn.Module:
        return self.model_per
