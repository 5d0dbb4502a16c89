"""Export and import of run state as plain containers of tensors and numbers.

Used by checkpoints (``torch.save`` / ``torch.load(weights_only=True)``: no arbitrary pickle) and by
executors that move a client's state to a worker and back. Objects that must keep their identity
(modules, optimisers, generators: other objects hold references to them) are restored in place.

Supported values: ``nn.Module``, ``torch.optim.Optimizer``, LR schedulers, ``torch.Generator``,
``numpy.random.Generator``, tensors, NumPy arrays, dicts, lists, tuples, numbers, strings, None.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

_MODULE, _OPTIMIZER, _SCHEDULER = "__module__", "__optimizer__", "__scheduler__"
_GENERATOR, _NP_GENERATOR, _NDARRAY, _TUPLE = "__torch_generator__", "__numpy_generator__", "__ndarray__", "__tuple__"


def export_value(value: Any) -> Any:
    """A copy of ``value`` made only of tensors, numbers, strings, lists and dicts."""
    if isinstance(value, nn.Module):
        return {_MODULE: {k: v.detach().clone() for k, v in value.state_dict().items()}}
    if isinstance(value, torch.optim.Optimizer):
        return {_OPTIMIZER: export_value(value.state_dict())}
    if isinstance(value, torch.optim.lr_scheduler.LRScheduler):
        return {_SCHEDULER: export_value(value.state_dict())}
    if isinstance(value, torch.Generator):
        return {_GENERATOR: value.get_state()}
    if isinstance(value, np.random.Generator):
        return {_NP_GENERATOR: _bit_generator_state(value)}
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, np.ndarray):
        return {_NDARRAY: torch.from_numpy(np.ascontiguousarray(value).copy())}
    if isinstance(value, dict):
        return {k: export_value(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return {_TUPLE: [export_value(v) for v in value]}
    if isinstance(value, list):
        return [export_value(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    raise TypeError(f"cannot export state of type {type(value).__name__}")


def import_value(current: Any, saved: Any) -> Any:
    """The value to hold after loading ``saved``; objects with identity are updated in place."""
    if isinstance(saved, dict) and len(saved) == 1:
        (tag, payload), = saved.items()
        if tag == _MODULE:
            current.load_state_dict(payload)
            return current
        if tag == _OPTIMIZER:
            current.load_state_dict(_plain(payload))
            return current
        if tag == _SCHEDULER:
            current.load_state_dict(_plain(payload))
            return current
        if tag == _GENERATOR:
            current.set_state(payload)
            return current
        if tag == _NP_GENERATOR:
            current.bit_generator.state = _plain(payload)
            return current
        if tag == _NDARRAY:
            return payload.numpy().copy()
        if tag == _TUPLE:
            return tuple(_plain(v) for v in payload)
    return _plain(saved)


def _plain(saved: Any) -> Any:
    """Rebuild a value that has no identity to preserve (containers, tensors, numbers)."""
    if isinstance(saved, dict):
        if len(saved) == 1 and next(iter(saved)) in (_NDARRAY, _TUPLE):
            return import_value(None, saved)
        return {k: _plain(v) for k, v in saved.items()}
    if isinstance(saved, list):
        return [_plain(v) for v in saved]
    if isinstance(saved, torch.Tensor):
        return saved.clone()
    return saved


def _bit_generator_state(rng: np.random.Generator) -> dict:
    return export_value(rng.bit_generator.state)


def export_attrs(owner: Any, names) -> dict:
    return {name: export_value(getattr(owner, name)) for name in names}


def import_attrs(owner: Any, saved: dict) -> None:
    for name, value in saved.items():
        setattr(owner, name, import_value(getattr(owner, name, None), value))
