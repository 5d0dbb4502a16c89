"""APPLE's client (Luo, Wu, "Adapt to Adaptation: Learning Personalization for Cross-Silo Federated
Learning", IJCAI 2022).

``model`` is the client's core model theta_i, uploaded every round; ``relationships.p`` is its directed
relationship vector p_i (one weight per training client), which never leaves it. Its personalised model is
``theta_hat_i = sum_j p_ij theta_j``, with its own theta_i live and the other clients' core models as the
server sent them (``core_models``, stacked along a client axis, only while it trains). One backward pass of
``CE(theta_hat_i) + mu_r/2 ||p_i - p0||^2`` gives the paper's two updates::

    theta_i <- theta_i - eta_1 * p_ii * grad CE(theta_hat_i)
    p_ij    <- p_ij - eta_2 * (<grad CE(theta_hat_i), theta_j> + mu_r (p_ij - p0_j))

with eta_2 = ``-dlr`` and mu_r the server's faded ``-mu``. eta_1 is ``-lr`` times the number of clients N, as
in PFLlib: p_ii starts at the client's share of the samples, 1/N on average, so without it a core model would
learn about N times slower than a FedAvg model at the same ``-lr``. The personalised model, formed at the end
of each local training, is what the client reports.
"""
from __future__ import annotations

import copy
from typing import AbstractSet, Dict

import torch
from torch import nn
from torch.func import functional_call

from flcore.aggregation import copy_into, named_tensors
from flcore.clients.clientbase import Client
from flcore.hyperparameters import APPLEParams
from flcore.vmapped.support import Refused


class Relationships(nn.Module):
    """p_i as a module, so that checkpoints restore it in place under the optimiser that steps it."""

    def __init__(self, size: int, device: torch.device):
        super().__init__()
        self.p = nn.Parameter(torch.zeros(size, device=device))


def mixed_parameters(own: Dict[str, torch.Tensor], own_index: int, p: torch.Tensor,
                     core_models: Dict[str, torch.Tensor], unmixed: AbstractSet[str] = frozenset()
                     ) -> Dict[str, torch.Tensor]:
    """``theta_hat = sum_j p_j theta_j`` by parameter name, differentiable in ``p`` and in ``own``.

    ``core_models[name]``: (N, *shape), row j client j's core model; row ``own_index`` is replaced by the
    live ``own[name]``. Names in ``unmixed`` (the layers X+LAG keeps personal) take ``own[name]`` alone, with
    its gradient scaled by 1/N, the step every mixed tensor's gradient gets through p_ii ~ 1/N, so that
    eta_1 = N * lr does not move them N times faster.
    """
    others = p * (torch.arange(len(p), device=p.device) != own_index)
    mixed = {}
    for name, param in own.items():
        if name in unmixed:
            mixed[name] = param.detach() + (param - param.detach()) / len(p)
        else:
            mixed[name] = torch.tensordot(others, core_models[name], dims=1) + p[own_index] * param
    return mixed


class clientAPPLE(Client):
    batched = Refused("each step mixes every client's core model through relationships it learns at their own "
                      "rate (-dlr)")
    persistent_attrs = ("relationships", "personalised_model")

    hparams: APPLEParams

    def setup(self) -> None:
        device = next(self.model.parameters()).device
        count = self.config.num_clients
        self.relationships = Relationships(count, device)
        self.optimizer = torch.optim.SGD([
            {"params": list(self.model.parameters()), "lr": self.learning_rate * count},
            {"params": list(self.relationships.parameters()), "lr": self.hparams.relationship_learning_rate}])
        self.learning_rate_scheduler = self.make_scheduler(self.optimizer)
        # theta_hat, formed at the end of each local training; before the first, the initial model (= sum_j
        # p0_j theta_init, p0 summing to 1).
        self.personalised_model = copy.deepcopy(self.model).requires_grad_(False)
        self.initial_relationships = torch.zeros(count, device=device)  # p0, set by the server
        # This round's inputs from the server, held only while training.
        self.core_models: Dict[str, torch.Tensor] = {}
        self.pull_weight = 0.0
        self.unmixed: AbstractSet[str] = frozenset()

    def start_relationships(self, p0: torch.Tensor) -> None:
        """p0 (the clients' sample shares), which p_i starts from and is pulled towards."""
        self.initial_relationships = p0.to(self.initial_relationships.device)
        with torch.no_grad():
            self.relationships.p.copy_(self.initial_relationships)

    def receive_core_models(self, core_models: Dict[str, torch.Tensor], pull_weight: float,
                            unmixed: AbstractSet[str] = frozenset()) -> None:
        """This round's core models (N, *shape) by parameter name (read, never changed), mu_r, and the tensors
        this client does not mix."""
        self.core_models, self.pull_weight, self.unmixed = core_models, float(pull_weight), unmixed

    def personalised_parameters(self) -> Dict[str, torch.Tensor]:
        return mixed_parameters(dict(self.model.named_parameters()), self.id, self.relationships.p,
                                self.core_models, self.unmixed)

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = functional_call(self.model, self.personalised_parameters(), (x,))
        loss = self.loss(logits, y)
        if self.pull_weight:
            loss = loss + 0.5 * self.pull_weight * (self.relationships.p - self.initial_relationships).pow(2).sum()
        return loss

    def end_local_training(self) -> None:
        self.form_personalised_model()

    @torch.no_grad()
    def form_personalised_model(self) -> None:
        """theta_hat from the current core models and p_i (buffers: the client's own); the round's core
        models are then let go."""
        copy_into(self.personalised_model, self.personalised_parameters())
        copy_into(self.personalised_model, dict(self.model.named_buffers()))
        self.core_models = {}

    def fine_tune(self, epochs: int) -> None:
        """A new client, which no other client mixes in and which has no relationships learnt: cross-entropy
        SGD at -lr on the model it received, which it then reports."""
        self.model.train()
        optimizer = torch.optim.SGD(self.model.parameters(), lr=self.learning_rate)
        self.run_epochs(epochs, lambda x, y: self.loss(self.model(x), y), optimizer)
        copy_into(self.personalised_model, named_tensors(self.model))

    def evaluation_model(self) -> nn.Module:
        return self.personalised_model
