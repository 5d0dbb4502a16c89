"""Small tools for clients that keep a private model beside the shared one.

Used by Ditto, APFL, pFedMe, PerAvg and FedPHP. In all of them ``client.model`` is the SHARED copy
(what is uploaded and what the broadcast overwrites, so that ``X+LAG`` ranks only shared tensors) and
the private model lives in another attribute that the broadcast never touches.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, Mapping, Optional

import torch
from torch import nn

from flcore.clients.clientbase import DivergenceError
from flcore.training.objective import squared_distance

State = Dict[str, torch.Tensor]


def parameter_views(module: nn.Module) -> State:
    """Detached views of ``module``'s parameters: they follow later in-place updates, take no gradient."""
    return {name: param.detach() for name, param in module.named_parameters()}


def parameter_copies(module: nn.Module) -> State:
    """Detached copies of ``module``'s parameters, frozen at the time of the call."""
    return {name: param.detach().clone() for name, param in module.named_parameters()}


def squared_distance_to(module: nn.Module, anchor: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``sum_l ||theta_l - anchor_l||^2`` over ``module``'s parameters; differentiable in ``module`` only."""
    return squared_distance(module.named_parameters(), anchor)


def interpolate(first: Mapping[str, torch.Tensor], second: Mapping[str, torch.Tensor], weight_first: float,
                names: Optional[Iterable[str]] = None) -> State:
    """``weight_first * first + (1 - weight_first) * second`` for every floating-point tensor.

    Integer tensors (BatchNorm's batch counter) cannot be mixed; they are taken from ``second``.
    ``weight_first`` may lie outside [0, 1] (pFedMe's server step with beta = 2 extrapolates).
    """
    out: State = {}
    for name in (second if names is None else names):
        a, b = first[name].detach(), second[name].detach()
        out[name] = torch.lerp(b, a, float(weight_first)) if b.is_floating_point() else b.clone()
    return out


def run_batch_steps(client, epochs: int, batch_size: int,
                    step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """:meth:`Client.run_epochs` for methods whose per-batch update is more than one optimiser step
    (pFedMe's K inner steps, PerAvg's two-batch meta-step). ``step`` returns the batch's loss.
    """
    nonfinite = torch.zeros((), dtype=torch.bool, device=client.train_data.y.device)
    for _ in range(epochs):
        for x, y in client.train_data.train_batches(batch_size, client.generator):
            loss = step(x, y)
            # Accumulated, not checked per batch: no device synchronisation per step.
            nonfinite |= ~torch.isfinite(loss.detach())
    if bool(nonfinite):
        raise DivergenceError(client.id)

