"""Parameter transport and averaging by name: pure functions of tensors.

Models exchange ``name -> tensor`` maps (parameters and buffers), never ``zip(parameters())``
positions, so a partial model (only ``base``) and a full model can never be silently misaligned.
"""
from __future__ import annotations

from typing import Dict, Iterable, Mapping, Sequence

import torch
from torch import nn

State = Dict[str, torch.Tensor]


def named_tensors(module: nn.Module) -> State:
    """Live references to a module's parameters and buffers, by name."""
    state: State = dict(module.named_parameters())
    state.update(module.named_buffers())
    return state


def zeros_like_parameters(module: nn.Module) -> State:
    """A zero tensor per named parameter of ``module``: the start of control variates and drift sums."""
    return {name: torch.zeros_like(param) for name, param in module.named_parameters()}


def weighted_average(states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float],
                     names: Iterable[str] | None = None) -> State:
    """``sum_i weights[i] * states[i][name]`` for every floating-point tensor.

    Integer tensors (BatchNorm's ``num_batches_tracked``) are counters, not estimates: the
    largest is kept. ``names`` restricts the result (default: every name of ``states[0]``).
    Accumulation runs in the given order, so the result is deterministic.
    """
    if not states:
        raise ValueError("weighted_average needs at least one state")
    if len(states) != len(weights):
        raise ValueError(f"{len(states)} states but {len(weights)} weights")
    names = list(states[0]) if names is None else list(names)
    out: State = {}
    for name in names:
        first = states[0][name]
        if first.is_floating_point():
            acc = torch.zeros_like(first, memory_format=torch.preserve_format)
            for state, w in zip(states, weights):
                acc.add_(state[name].detach(), alpha=float(w))
            out[name] = acc
        else:
            out[name] = torch.stack([s[name].detach() for s in states]).amax(dim=0)
    return out


def sample_weights(num_samples: Sequence[int]) -> list[float]:
    """FedAvg weights ``n_i / sum(n)``; uniform when every count is zero; empty for no uploads."""
    if len(num_samples) == 0:
        return []
    total = float(sum(num_samples))
    if total <= 0:
        return [1.0 / len(num_samples)] * len(num_samples)
    return [n / total for n in num_samples]


@torch.no_grad()
def copy_into(module: nn.Module, state: Mapping[str, torch.Tensor], names: Iterable[str] | None = None) -> None:
    """Overwrite ``module``'s tensors in place with ``state`` (all names, or only ``names``).

    In place, so optimisers and other references to the parameters stay valid.
    """
    target = named_tensors(module)
    for name in (state if names is None else names):
        if name not in target:
            raise KeyError(f"{name!r} is not a parameter or buffer of {type(module).__name__}")
        target[name].copy_(state[name])
