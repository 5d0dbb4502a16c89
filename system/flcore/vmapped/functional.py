"""A client model run as a function of its tensors, so one call can be vmapped over many clients."""
from __future__ import annotations

import copy
from typing import Dict, List

import torch
from torch import nn
from torch.func import functional_call

Tensors = Dict[str, torch.Tensor]


def _template(model: nn.Module, training: bool) -> nn.Module:
    clone = copy.deepcopy(model)
    for param in clone.parameters():
        param.grad = None
    return clone.requires_grad_(False).train(training)


class FunctionalNet:
    """Two copies of a client model used only for their structure: one in train mode (the model being
    trained: BatchNorm normalises with the batch and updates the running statistics it is given), one
    in eval mode (frozen teachers, as :func:`flcore.training.received.frozen_copy` runs them).

    ``run`` takes every parameter and buffer of the (sub)module explicitly (``strict``), so no value of
    the copies themselves ever enters a result."""

    def __init__(self, model: nn.Module):
        self.training_copy = _template(model, True)
        self.eval_copy = _template(model, False)
        self.param_names: List[str] = [name for name, _ in model.named_parameters()]
        self.buffer_names: List[str] = [name for name, _ in model.named_buffers()]

    def run(self, x: torch.Tensor, params: Tensors, buffers: Tensors, part: str = "",
            training: bool = True) -> torch.Tensor:
        """The output of ``model.get_submodule(part)`` on ``x``; names are relative to ``part``."""
        root = self.training_copy if training else self.eval_copy
        module = root.get_submodule(part) if part else root
        return functional_call(module, (params, buffers), (x,), strict=True)


def part_of(tensors: Tensors, prefix: str) -> Tensors:
    """The entries under ``prefix`` (``"base."``), with the prefix removed."""
    return {name[len(prefix):]: value for name, value in tensors.items() if name.startswith(prefix)}
