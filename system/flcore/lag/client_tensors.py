"""A client's model tensors by full name, read and written without building the model where the client
can (this project's clients park their modules as tensors between uses), and through ``client.model``
where it cannot (PFLlib's clients, each holding its own model). Imports only torch, as the rest of ``lag/``.
"""
from __future__ import annotations

from typing import Dict, Mapping

import torch

State = Dict[str, torch.Tensor]


def model_tensors(client) -> State:
    """Every parameter and buffer of ``client``'s model by full name (read them, never write them)."""
    read = getattr(client, "module_tensors", None)
    if callable(read):
        return read()
    model = client.model
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def model_snapshot(client) -> State:
    """``client``'s model tensors as they are now, held until it has trained: a parked client's own tensors
    by reference (nobody writes them: training and a broadcast replace them), anyone else's copied."""
    is_parked = getattr(client, "is_parked", None)
    if callable(is_parked) and is_parked("model"):
        return model_tensors(client)
    return {name: tensor.detach().clone() for name, tensor in model_tensors(client).items()}


@torch.no_grad()
def write_model_tensors(client, values: Mapping[str, torch.Tensor]) -> None:
    """Set tensors of ``client``'s model by full name, as ``copy_`` into them would. ``values`` are never
    written afterwards, so a client that can keeps references to them (one copy for a whole group)."""
    receive = getattr(client, "receive_tensors", None)
    if callable(receive):
        receive(values, frozen=True)
        return
    live = model_tensors(client)
    for name, value in values.items():
        live[name].copy_(value)
