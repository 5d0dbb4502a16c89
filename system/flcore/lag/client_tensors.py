"""A client's model tensors by full name, read without building the model where the client can (this
project's clients park their modules as tensors between uses), and through ``client.model`` where it cannot
(PFLlib's clients, each holding its own model). Reads only: what a client holds changes through the server's
payloads (``Server.payload``), never from here. Imports only torch, as the rest of ``lag/``.
"""
from __future__ import annotations

from typing import Dict

import torch

State = Dict[str, torch.Tensor]


def model_tensors(client) -> State:
    """Every parameter and buffer of ``client``'s model by full name (read them, never write them)."""
    read = getattr(client, "module_tensors", None)
    if callable(read):
        return read()
    model = client.model
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def model_of(client):
    """``client.model``, in use: this project's clients park their modules between uses and are checked out
    first (the run parks them again after the hook); PFLlib's hold theirs all the time."""
    check_out = getattr(client, "check_out", None)
    if callable(check_out):
        check_out()
    return client.model


def model_snapshot(client) -> State:
    """``client``'s model tensors as they are now, held until it has trained: a parked client's own tensors
    by reference (nobody writes them: training and a delivery replace them), anyone else's copied."""
    is_parked = getattr(client, "is_parked", None)
    if callable(is_parked) and is_parked("model"):
        return model_tensors(client)
    return {name: tensor.detach().clone() for name, tensor in model_tensors(client).items()}
