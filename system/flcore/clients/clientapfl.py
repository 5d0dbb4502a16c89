"""APFL's client (Deng, Kamani, Mahdavi, "Adaptive Personalized Federated Learning", arXiv 2003.13461, 2020).

``model`` is the client's copy of the global model w (shared, uploaded); ``model_local`` is the
private model v; ``mixing.alpha`` is the private mixing weight. The personalised model is
``alpha * v + (1 - alpha) * w``. Every minibatch takes, from the same iterate and the same batch
(Algorithm 1 of the paper), one SGD step on each of::

    w     <- w - lr * grad f(w)
    v     <- v - lr * alpha * grad f(vbar)                 vbar = alpha v + (1 - alpha) w
    alpha <- clip(alpha - lr * <v - w, grad f(vbar)>, 0, 1)

which is one backward pass of ``f(w) + f(alpha v + (1 - alpha) w.detach())``. The personalised
mixture, formed with the w the client currently holds, is what the client reports.
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.func import functional_call

from flcore.aggregation import copy_into, named_tensors
from flcore.vmapped.support import Refused
from flcore.clients.clientbase import Client
from flcore.hyperparameters import APFLParams
from flcore.training.personal import interpolate, parameter_views


class MixingWeight(nn.Module):
    """alpha as a module, so that checkpoints restore it in place under the optimiser that steps it."""

    def __init__(self, alpha: float, device: torch.device):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(alpha), device=device))


class clientAPFL(Client):
    batched = Refused("every step also moves a private model and the mixing weight (after_step)")
    persistent_attrs = ("model_local", "mixing")

    hparams: APFLParams

    def setup(self) -> None:
        device = next(self.model.parameters()).device
        self.model_local = copy.deepcopy(self.model)
        self.mixing = MixingWeight(self.hparams.initial_mixing, device)
        # One optimiser (and one decay schedule) for w, v and alpha: the paper uses one step size.
        self.optimizer = self.make_optimizer([
            {"params": list(self.model.parameters())},
            {"params": list(self.model_local.parameters())},
            {"params": list(self.mixing.parameters())}])
        self.learning_rate_scheduler = self.make_scheduler(self.optimizer)
        # Scratch module holding the mixture for evaluation; derived, so not persistent.
        self.model_per = copy.deepcopy(self.model).requires_grad_(False)

    @property
    def alpha(self) -> float:
        return float(self.mixing.alpha.detach())

    def begin_local_training(self) -> None:
        self.model_local.train()

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        alpha = self.mixing.alpha
        shared = parameter_views(self.model)
        mixed = {name: alpha * v + (1 - alpha) * shared[name] for name, v in self.model_local.named_parameters()}
        # v's own buffers (BatchNorm statistics) track the mixture, which is the model v serves in.
        personal_logits = functional_call(self.model_local, mixed, (x,))
        return self.loss(self.model(x), y) + self.loss(personal_logits, y)

    def after_step(self) -> None:
        with torch.no_grad():
            self.mixing.alpha.clamp_(0.0, 1.0)

    def fine_tune(self, epochs: int) -> None:
        """A new client learns v and alpha (and adapts w) with APFL's own updates; v starts as the
        received global model (it has no local model of its own yet)."""
        copy_into(self.model_local, named_tensors(self.model))
        self.model.train()
        self.begin_local_training()
        self.run_epochs(epochs, self.local_loss)

    @torch.no_grad()
    def evaluation_model(self) -> nn.Module:
        """The personalised model ``alpha * v + (1 - alpha) * w`` (not v or w alone: PFLlib #51)."""
        mixed = interpolate(parameter_views(self.model_local), parameter_views(self.model), self.alpha)
        copy_into(self.model_per, mixed)
        copy_into(self.model_per, dict(self.model_local.named_buffers()))
        return self.model_per
