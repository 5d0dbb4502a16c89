"""FedPHP's client (Li, Zhan, Shao, Li, Song, "FedPHP: Federated Personalization with Inherited Private
Models", ECML-PKDD 2021).

``model`` starts every round from the received global model, is trained on
``(1 - lamda) * CE + lamda * MMD(base(x), hpm.base(x))`` (``-lam``; the teacher's features are fixed)
and is uploaded. ``model_hpm`` is the private inherited model (HPM), the moving average of the
client's locally trained models: after local training ``hpm <- mu_c * hpm + (1 - mu_c) * model`` with
``mu_c = min(mu * c / (jr * gr), mu)``, c = the client's earlier participations (``-mu`` is the
ceiling; the authors use 0.9). The HPM is what the client reports.

As in the authors' code (lxcnju/FedRepo), the HPM is the teacher and inherits from the trained local
model. PFLlib swaps the roles: it distils from the global model and uploads the inherited model.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from flcore.aggregation import copy_into, named_tensors
from flcore.vmapped.support import Refused
from flcore.clients.clientbase import Client
from flcore.hyperparameters import FedPHPParams
from flcore.training.personal import interpolate


def mmd_rbf(source: torch.Tensor, target: torch.Tensor, kernel_mul: float = 2.0, kernel_num: int = 5) -> torch.Tensor:
    """Maximum mean discrepancy between two (B, D) samples under a sum of Gaussian kernels.

    Bandwidths are ``h * kernel_mul**(i - kernel_num // 2)``, i = 0..kernel_num-1, where h is the mean
    squared distance between distinct points of both samples (not differentiated), as in the authors' code.
    """
    total = torch.cat([source, target]).flatten(1)
    sq_norms = total.pow(2).sum(dim=1)
    sq_dist = (sq_norms[:, None] + sq_norms[None, :] - 2.0 * total @ total.T).clamp_min(0.0)
    n = total.shape[0]
    mean_sq = sq_dist.detach().sum() / max(n * n - n, 1) + 1e-8
    smallest = mean_sq / kernel_mul ** (kernel_num // 2)
    kernel = sum(torch.exp(-sq_dist / (smallest * kernel_mul ** i)) for i in range(kernel_num))
    b = source.shape[0]
    return kernel[:b, :b].mean() + kernel[b:, b:].mean() - 2.0 * kernel[:b, b:].mean()


class clientPHP(Client):
    batched = Refused("its distillation from the inherited private model is not ported to the batched engine")
    persistent_attrs = ("model_hpm", "participations")

    hparams: FedPHPParams

    def setup(self) -> None:
        self.lamda = self.hparams.distillation_weight
        self.mu = self.hparams.inheritance_ceiling
        self.expected_participations = 1  # set by the server, which knows how it samples
        self.model_hpm = copy.deepcopy(self.model).requires_grad_(False)
        self.participations = 0

    def begin_local_training(self) -> None:
        self.model_hpm.eval()  # a fixed teacher: no dropout, BatchNorm on its running statistics

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        features = self.model.base(x)
        loss = self.loss(self.model.head(features), y)
        if self.lamda == 0:
            return loss
        with torch.no_grad():
            teacher = self.model_hpm.base(x)
        return (1.0 - self.lamda) * loss + self.lamda * mmd_rbf(features, teacher)

    def end_local_training(self) -> None:
        self.inherit()

    def inheritance_weight(self) -> float:
        """mu_c: 0 at a client's first participation, rising linearly to ``-mu``."""
        return min(self.mu * self.participations / self.expected_participations, self.mu)

    @torch.no_grad()
    def inherit(self) -> None:
        mu = self.inheritance_weight()
        copy_into(self.model_hpm, interpolate(named_tensors(self.model_hpm), named_tensors(self.model), mu))
        self.participations += 1

    def fine_tune(self, epochs: int) -> None:
        """A new client trains once as in a round, with the received global model as its teacher (its
        HPM starts there); its first HPM is then the trained model (mu_c = 0)."""
        copy_into(self.model_hpm, named_tensors(self.model))
        self.model.train()
        self.begin_local_training()
        self.run_epochs(epochs, self.local_loss)
        self.end_local_training()

    def evaluation_model(self) -> nn.Module:
        return self.model_hpm
