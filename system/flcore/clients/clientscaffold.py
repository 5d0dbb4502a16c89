"""SCAFFOLD's client (Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, "SCAFFOLD: Stochastic
Controlled Averaging for Federated Learning", ICML 2020).

The whole model is shared. Every local step follows ``g - c_i + c`` instead of the raw gradient
``g`` (applied in :meth:`after_step` as the extra move ``-lr * (c - c_i)``), which cancels the
client's drift towards its own optimum. After K steps the control variate is refreshed with the
paper's option II, ``c_i+ = c_i - c + (x - y) / (K * lr)`` (x: the model the client started from,
y: after training), and ``delta_c = c_i+ - c_i`` goes to the server in the upload. ``c_i`` is
persistent client state; ``c`` is received from the server before training.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from flcore.clients.parked_modules import FrozenTensors
from flcore.vmapped.support import Refused
from flcore.training.received import ReceivedModelClient

Controls = Dict[str, torch.Tensor]


class clientSCAFFOLD(ReceivedModelClient):
    batched = Refused("every step is followed by the control-variate correction (after_step)")
    # Besides c_i: c is received by the broadcast but read during training, so it travels with the client
    # wherever it trains; delta_c is written by training and leaves in the upload (zeros between rounds).
    persistent_attrs = ("control", "server_control", "control_delta")

    def setup(self) -> None:
        super().setup()
        # Until a client trains, its variates are zero: one frozen set of zeros shared by every client
        # (never written: training and receive_control put new tensors in place), not its own state.
        zeros = shared_zeros(self.model)
        self.control: Controls = zeros          # c_i
        self.server_control: Controls = zeros   # c, as last received
        self.control_delta: Controls = zeros    # c_i+ - c_i of the last local training
        self.local_steps = 0
        self.step_size = self.learning_rate
        self._corrections: Optional[List[Tuple[torch.Tensor, torch.Tensor]]] = None

    @torch.no_grad()
    def receive_control(self, server_control: Mapping[str, torch.Tensor]) -> None:
        """c as the server sends it: a frozen copy is kept by reference (one for every client), any
        other copied."""
        if isinstance(server_control, FrozenTensors):
            self.server_control = server_control
        else:
            self.server_control = {name: value.clone() for name, value in server_control.items()}

    def begin_local_training(self) -> None:
        super().begin_local_training()
        self.local_steps = 0
        # The rate the steps are taken with (a -ld decay step comes after them).
        self.step_size = self.optimizer.param_groups[0]["lr"]
        self._corrections = [(param, self.server_control[name] - self.control[name])
                             for name, param in self.model.named_parameters()]

    @torch.no_grad()
    def after_step(self) -> None:
        if self._corrections is None:  # plain fine-tuning (new clients) is not corrected
            return
        for param, correction in self._corrections:
            param.sub_(correction, alpha=self.step_size)
        self.local_steps += 1

    @torch.no_grad()
    def end_local_training(self) -> None:
        self._corrections = None
        if self.local_steps == 0:
            self.control_delta = shared_zeros(self.model)
        else:
            start = dict(self.received_model.named_parameters())
            scale = 1.0 / (self.local_steps * self.step_size)
            control, delta = {}, {}
            for name, param in self.model.named_parameters():
                control[name] = self.control[name] - self.server_control[name] + (start[name] - param) * scale
                delta[name] = control[name] - self.control[name]
            self.control, self.control_delta = control, delta
        super().end_local_training()

    def upload_extras(self) -> dict:
        # Handed over: the server reads delta_c from the update only. Kept, it would be a model's worth of
        # dead state in every client that ever trained (45 MB each with ResNet18).
        delta, self.control_delta = self.control_delta, shared_zeros(self.model)
        return {"control_delta": delta}


_ZEROS: Dict[tuple, FrozenTensors] = {}


def shared_zeros(model: nn.Module) -> FrozenTensors:
    """Zeros shaped as ``model``'s parameters, one frozen set per structure in this process: each a single
    zero expanded to the shape, so it takes no memory and refuses any write into it."""
    params = dict(model.named_parameters())
    key = tuple((name, tuple(p.shape), p.dtype, str(p.device)) for name, p in params.items())
    if key not in _ZEROS:
        _ZEROS[key] = FrozenTensors((name, torch.zeros((), dtype=p.dtype, device=p.device).expand(p.shape))
                                    for name, p in params.items())
    return _ZEROS[key]

