"""Training only part of a head-split model: one optimiser per part, and temporary freezing.

Shared by FedRep (head stage, then body stage) and FedBABU (body only, then whole-model fine-tuning).
An optimiser that holds only one part can never step the other, and switching ``requires_grad`` off
for the rest skips its backward pass as well.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Tuple

import torch
from torch import nn

from flcore.clients.clientbase import Client

Scheduler = torch.optim.lr_scheduler.LRScheduler


def part_optimizer(client: Client, part: nn.Module) -> Tuple[torch.optim.Optimizer, Scheduler]:
    """The client's optimiser over ``part`` only, with the ``-ld``/``-ldg`` decay schedule."""
    optimizer = client.make_optimizer(part.parameters())
    scheduler = client.make_scheduler(optimizer)
    return optimizer, scheduler


@contextmanager
def only_trainable(model: nn.Module, part: nn.Module) -> Iterator[None]:
    """Inside the block only ``part``'s parameters require gradients; the flags are restored after."""
    saved = [(p, p.requires_grad) for p in model.parameters()]
    model.requires_grad_(False)
    part.requires_grad_(True)
    try:
        yield
    finally:
        for param, flag in saved:
            param.requires_grad_(flag)


def fine_tune_whole_model(client: Client, epochs: int) -> None:
    """Cross-entropy SGD on every parameter (base and head) at the client's current learning rate.

    A fresh optimiser: the client's own one holds only the part it trains during federated rounds.
    """
    model = client.model
    optimizer = client.make_optimizer(model.parameters())
    for group in optimizer.param_groups:
        group["lr"] = client.optimizer.param_groups[0]["lr"]
    model.train()
    with only_trainable(model, model):
        client.run_epochs(epochs, lambda x, y: client.loss(model(x), y), optimizer)


def train_head_then_base(client: Client, head_epochs: int, head_loss: Callable, base_loss: Callable) -> None:
    """One local round of FedRep / FedPAC: the head adapts to the base just received (base frozen),
    then the base learns under that head (head frozen); each stage steps only its own optimiser."""
    client.model.train()
    client.begin_local_training()
    with only_trainable(client.model, client.model.head):
        client.run_epochs(head_epochs, head_loss, client.head_optimizer)
    with only_trainable(client.model, client.model.base):
        client.run_epochs(client.local_epochs, base_loss, client.optimizer)
    if client.learning_rate_decay:
        client.head_scheduler.step()
        client.learning_rate_scheduler.step()
    client.end_local_training()
