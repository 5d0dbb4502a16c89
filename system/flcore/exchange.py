"""What a client sends back after local training, as one value.

Every executor (sequential, batched, Ray, Flower) returns a :class:`ClientUpdate` per trained client,
and servers aggregate a list of them: no server reaches into a client object for the result of
training. An algorithm that uploads more than parameters (a control delta, prototypes, a Fisher
trace) puts it in :attr:`ClientUpdate.extras` through :meth:`Client.upload_extras
<flcore.clients.clientbase.Client.upload_extras>`.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np
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


TensorSpec = Dict[str, Tuple[Tuple[int, ...], torch.dtype]]


def tensor_spec(tensors: Mapping[str, torch.Tensor]) -> TensorSpec:
    """``{name: (shape, dtype)}`` of ``tensors``: what an update of them must carry."""
    return {name: (tuple(t.shape), t.dtype) for name, t in tensors.items()}


# No local training moves a value a million times beyond the scale of the model it started from; a value
# that far out (1e30 in a model of unit scale) is a poisoned or broken upload, and it would dominate the
# average and overflow the squares the conflict scores sum.
MAGNITUDE_FACTOR = 1e6


def magnitude_limit(reference: Mapping[str, torch.Tensor]) -> float:
    """The largest magnitude an update of the model ``reference`` (what was sent) may hold."""
    scales = [float(t.detach().abs().max()) for t in reference.values() if t.is_floating_point() and t.numel()]
    return MAGNITUDE_FACTOR * (1.0 + max(scales, default=0.0))


def update_problem(tensors: Mapping[str, torch.Tensor], expected: TensorSpec, num_samples: object,
                   max_samples: Optional[int] = None, gradients: Optional[Mapping[str, torch.Tensor]] = None,
                   limit: Optional[float] = None) -> Optional[str]:
    """Why an upload must not be averaged, or None: checked at the edge, before aggregation reads it.

    The tensor names must be exactly those ``expected`` and each of the expected shape and dtype (so a
    wrongly shaped tensor can neither become the global one nor crash the average), every value finite
    (one NaN would become every client's model) and, with ``limit`` (:func:`magnitude_limit`), of at
    most that magnitude, and the sample count, which weighs the upload, a whole number in
    ``[1, max_samples]`` (a count of 1e9 or below zero would let one client dictate the average).
    ``gradients``, when the update carries them, must name only its tensors and be finite too.
    """
    names = set(tensors)
    if names != set(expected):
        missing, extra = sorted(set(expected) - names), sorted(names - set(expected))
        return ("its tensors do not match what was sent" + (f"; missing {_listed(missing)}" if missing else "")
                + (f"; unexpected {_listed(extra)}" if extra else ""))
    for name, (shape, dtype) in expected.items():
        tensor = tensors[name]
        if not isinstance(tensor, torch.Tensor):
            return f"{name} is a {type(tensor).__name__}, not a tensor"
        if tuple(tensor.shape) != tuple(shape) or tensor.dtype != dtype:
            return f"{name} has shape {tuple(tensor.shape)} and dtype {tensor.dtype}, expected {tuple(shape)} {dtype}"
    for kind, values in (("tensor", tensors), ("gradient", gradients or {})):
        for name, tensor in values.items():
            if kind == "gradient" and name not in expected:
                return f"a gradient of {name}, which it does not share"
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                return f"{kind} {name} holds a NaN or infinite value"
            if kind == "tensor" and limit is not None and tensor.is_floating_point() and tensor.numel() \
                    and float(tensor.abs().max()) > limit:
                return f"tensor {name} holds {float(tensor.abs().max()):.3g}, beyond {limit:.3g} (a million times " \
                       f"the scale of the model sent)"
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
        return f"its sample count {num_samples!r} is not a whole number >= 1"
    if max_samples is not None and num_samples > max_samples:
        return f"its sample count {int(num_samples)} is above the {max_samples} training samples it holds"
    return None


def _listed(names, limit: int = 5) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
