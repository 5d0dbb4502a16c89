"""What a client sends back after local training, as one value.

Every executor (sequential, batched, Ray, Flower) returns a :class:`ClientUpdate` per trained client,
and servers aggregate a list of them: no server reaches into a client object for the result of
training. An algorithm that uploads more than parameters (a control delta, prototypes, a Fisher
trace) puts it in :attr:`ClientUpdate.extras` through :meth:`Client.upload_extras
<flcore.clients.clientbase.Client.upload_extras>`.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict

import torch

State = Dict[str, torch.Tensor]


@dataclass(frozen=True)
class ClientUpdate:
    """One client's upload for one round.

    ``tensors``: the shared module's tensors (parameters and buffers) that the client shares, by name
    relative to ``shared_path`` (the sub-module of the client's model that is exchanged; "" is the whole
    model). In this process they are views of the client's tensors, read before the next broadcast;
    across processes they are copies. ``gradients``: the last minibatch's gradient of each shared
    parameter that has one (what FedLAG's ``--lag_signal last_batch`` scores), same names.
    ``extras``: whatever else the algorithm uploads, by name.
    """
    client_id: int
    num_samples: int
    tensors: State
    shared_path: str = ""
    gradients: State = field(default_factory=dict)
    extras: Dict[str, Any] = field(default_factory=dict)

    def full_name(self, name: str) -> str:
        """``name`` as it is called in the client's whole model."""
        return f"{self.shared_path}.{name}" if self.shared_path else name

    def without_gradients(self) -> "ClientUpdate":
        """The same update with no gradients: what crosses a process boundary unless they are scored."""
        return replace(self, gradients={}) if self.gradients else self
