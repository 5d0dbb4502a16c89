"""Hand computations shared by the tests of the methods with a private model (Ditto, APFL, pFedMe,
PerAvg, FedPHP): accuracy and train loss of any per-client model, computed without the house's code."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from helpers import in_use


@torch.no_grad()
def accuracy_of(clients: Sequence, pick: Callable[[object], nn.Module]) -> float:
    """sum of correct test predictions / sum of test samples, with ``pick(client)`` as each client's model."""
    correct = total = 0
    for client in clients:
        model = pick(in_use(client)).eval()
        correct += int((model(client.test_data.x).argmax(dim=1) == client.test_data.y).sum())
        total += len(client.test_data.y)
    return correct / total


@torch.no_grad()
def train_loss_of(clients: Sequence, pick: Callable[[object], nn.Module]) -> float:
    loss = total = 0.0
    for client in clients:
        model = pick(in_use(client)).eval()
        loss += float(F.cross_entropy(model(client.train_data.x), client.train_data.y, reduction="sum"))
        total += len(client.train_data.y)
    return loss / total


@torch.no_grad()
def zero_(module: nn.Module) -> nn.Module:
    """All-zero logits: argmax is class 0 and the cross-entropy is exactly ln(num_classes)."""
    for param in module.parameters():
        param.zero_()
    return module


def uniform_loss(num_classes: int) -> float:
    return math.log(num_classes)


@torch.no_grad()
def wiggle_(module: nn.Module, scale: float = 0.05) -> nn.Module:
    """A deterministic, non-uniform perturbation (so a private copy differs from the shared one)."""
    for index, param in enumerate(module.parameters()):
        ramp = torch.arange(param.numel(), dtype=param.dtype, device=param.device).reshape(param.shape)
        param.add_(scale * torch.sin(ramp + index))
    return module
