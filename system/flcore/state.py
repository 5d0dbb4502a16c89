"""Export and import of run state as plain containers of tensors and numbers.

Used by checkpoints (``torch.save`` / ``torch.load(weights_only=True)``: no arbitrary pickle) and by
executors that move a client's state to a worker and back. Objects that must keep their identity
(modules, optimisers, generators: other objects hold references to them) are restored in place.

Supported values: ``nn.Module``, ``torch.optim.Optimizer``, LR schedulers, ``torch.Generator``,
``numpy.random.Generator``, tensors, NumPy arrays, dicts, lists, tuples, numbers, strings, None.

Loading trusts nothing in the saved state: only the attribute names the owner declares are restored,
and :func:`check_value` compares the saved structure (kinds, module keys, tensor shapes and dtypes)
with the live objects before anything is changed, so a state that does not fit is refused whole.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

_MODULE, _OPTIMIZER, _SCHEDULER = "__module__", "__optimizer__", "__scheduler__"


class ModuleTensors(dict):
    """A module's ``state_dict`` standing for the module (a client's parked module,
    :mod:`flcore.clients.parking`): its tensors are never written, so it is exported without copies (a
    checkpoint stores a tensor that clients share once) and loading gives a new value holding the saved
    tensors themselves."""
_GENERATOR, _NP_GENERATOR, _NDARRAY, _TUPLE = "__torch_generator__", "__numpy_generator__", "__ndarray__", "__tuple__"


def export_value(value: Any) -> Any:
    """A copy of ``value`` made only of tensors, numbers, strings, lists and dicts."""
    if isinstance(value, ModuleTensors):
        return {_MODULE: dict(value)}
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
            if isinstance(current, ModuleTensors):
                return ModuleTensors(payload)
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


class StateError(ValueError):
    """A saved state does not fit the live objects; the message names the first attribute that differs."""


def check_value(current: Any, saved: Any, where: str) -> None:
    """Raise :class:`StateError` if ``saved`` cannot be loaded into ``current`` without changing its kind
    or shape. Containers are compared by their common keys, since their sizes legitimately grow (the
    history) or fill up (optimiser moments, masks that appear after the first round)."""
    tag = _tag_of(saved)
    if isinstance(current, (nn.Module, ModuleTensors)):
        _expect(tag == _MODULE, where, "a model")
        live = current if isinstance(current, ModuleTensors) else current.state_dict()
        _check_tensors(live, saved[_MODULE], where, exact_keys=True)
    elif isinstance(current, torch.optim.Optimizer):
        _expect(tag == _OPTIMIZER and isinstance(saved[_OPTIMIZER], dict), where, "an optimiser state")
        _check_optimizer(current, saved[_OPTIMIZER], where)
    elif isinstance(current, torch.optim.lr_scheduler.LRScheduler):
        _expect(tag == _SCHEDULER and isinstance(saved[_SCHEDULER], dict), where, "a scheduler state")
    elif isinstance(current, torch.Generator):
        _expect(tag == _GENERATOR and isinstance(saved[_GENERATOR], torch.Tensor), where, "a torch generator")
        _check_tensor(current.get_state(), saved[_GENERATOR], where)
    elif isinstance(current, np.random.Generator):
        _expect(tag == _NP_GENERATOR and isinstance(saved[_NP_GENERATOR], dict), where, "a NumPy generator")
        _expect(saved[_NP_GENERATOR].get("bit_generator") == current.bit_generator.state["bit_generator"],
                where, f"a {current.bit_generator.state['bit_generator']} NumPy generator")
    elif current is None:
        # Nothing live to compare with (e.g. a tensor set after the first round); but objects restored
        # in place need an object to restore into.
        _expect(tag in (None, _NDARRAY, _TUPLE), where, "a plain value (no live object to load it into)")
    elif saved is None:
        return  # an optional value that was unset when saved
    elif isinstance(current, torch.Tensor):
        _expect(isinstance(saved, torch.Tensor), where, "a tensor")
        _check_tensor(current, saved, where)
    elif isinstance(current, np.ndarray):
        _expect(tag == _NDARRAY and isinstance(saved[_NDARRAY], torch.Tensor), where, "an array")
        _expect(tuple(saved[_NDARRAY].shape) == current.shape, where,
                f"shape {tuple(current.shape)}, not {tuple(saved[_NDARRAY].shape)}")
    elif isinstance(current, dict):
        _expect(isinstance(saved, dict) and tag is None, where, "a dict")
        for key in saved.keys() & current.keys():
            check_value(current[key], saved[key], f"{where}[{key!r}]")
    elif isinstance(current, (list, tuple)):
        items = saved[_TUPLE] if tag == _TUPLE else saved
        _expect(isinstance(items, list), where, "a list")
        for i, (live, item) in enumerate(zip(current, items)):
            check_value(live, item, f"{where}[{i}]")
    elif isinstance(current, (bool, int, float, np.integer, np.floating, np.bool_)):
        _expect(isinstance(saved, (bool, int, float)), where, "a number")
    elif isinstance(current, str):
        _expect(isinstance(saved, str), where, "a string")


def export_attrs(owner: Any, names) -> dict:
    """``{name: export_value(owner.name)}`` for each of ``names``."""
    return {name: export_value(getattr(owner, name)) for name in names}


def check_attrs(owner: Any, saved: Any, names, where: str = "") -> None:
    """Raise :class:`StateError` unless ``saved`` holds exactly the attributes ``names``, each loadable
    into ``owner``'s live value (see :func:`check_value`)."""
    prefix = f"{where}." if where else ""
    if not isinstance(saved, dict):
        raise StateError(f"{where or 'state'}: expected a dict of attributes, found {type(saved).__name__}")
    unknown, missing = sorted(set(saved) - set(names)), [n for n in names if n not in saved]
    if unknown:
        raise StateError(f"{prefix}{unknown[0]}: not an attribute this object saves")
    if missing:
        raise StateError(f"{prefix}{missing[0]}: missing")
    for name in names:
        check_value(getattr(owner, name, None), saved[name], prefix + name)


def check_server_state(server: Any, state: object, extra: dict) -> None:
    """Raise :class:`StateError` unless ``state`` (a server's ``get_state()`` output) fits ``server``: its
    declared attributes only, one state per client (each checked by the client), ``extra`` (a mixin's state by key, with its live value) of the live structure, tensors of
    the live shapes. Changes nothing."""
    if not isinstance(state, dict):
        raise StateError("server: expected a dict of attributes")
    state = dict(state)
    clients = state.pop("clients", None)
    if not isinstance(clients, list) or len(clients) != len(server.clients):
        found = f"{len(clients)}" if isinstance(clients, list) else "none"
        raise StateError(f"server.clients: {len(server.clients)} client states expected, {found} found")
    for client, client_state in zip(server.clients, clients):
        client.check_state(client_state, f"clients[{client.id}]")
    for key, template in extra.items():
        if key in state:
            saved = state.pop(key)
            if not isinstance(saved, dict) or set(saved) != set(template):
                raise StateError(f"server.{key}: expected the entries {sorted(template)}")
            check_value(template, saved, f"server.{key}")
    check_attrs(server, state, server.state_names(), "server")


def import_attrs(owner: Any, saved: dict, names) -> None:
    """Restore the attributes ``names`` of ``owner`` from ``saved`` (an :func:`export_attrs` output).

    Checked first, in full, so that a state that does not fit (:class:`StateError`) changes nothing;
    a name outside ``names`` is refused, never set.
    """
    check_attrs(owner, saved, names)
    for name in names:
        setattr(owner, name, import_value(getattr(owner, name, None), saved[name]))


def _tag_of(saved: Any):
    if isinstance(saved, dict) and len(saved) == 1:
        key = next(iter(saved))
        if key in (_MODULE, _OPTIMIZER, _SCHEDULER, _GENERATOR, _NP_GENERATOR, _NDARRAY, _TUPLE):
            return key
    return None


def _expect(ok: bool, where: str, what: str) -> None:
    if not ok:
        raise StateError(f"{where}: expected {what}")


def _check_tensor(live: torch.Tensor, saved: Any, where: str) -> None:
    _expect(isinstance(saved, torch.Tensor), where, "a tensor")
    if tuple(saved.shape) != tuple(live.shape) or saved.dtype != live.dtype:
        raise StateError(f"{where}: shape {tuple(saved.shape)} {saved.dtype} in the saved state, "
                         f"{tuple(live.shape)} {live.dtype} here")


def _check_tensors(live: dict, saved: Any, where: str, exact_keys: bool) -> None:
    _expect(isinstance(saved, dict), where, "named tensors")
    if exact_keys and set(saved) != set(live):
        extra, absent = sorted(set(saved) - set(live)), sorted(set(live) - set(saved))
        raise StateError(f"{where}: " + (f"unexpected tensor {extra[0]!r}" if extra else f"missing tensor {absent[0]!r}"))
    for key in saved.keys() & live.keys():
        _check_tensor(live[key], saved[key], f"{where}.{key}")


def _check_optimizer(current: torch.optim.Optimizer, saved: dict, where: str) -> None:
    groups = saved.get("param_groups")
    _expect(isinstance(groups, list) and len(groups) == len(current.param_groups), where,
            f"{len(current.param_groups)} parameter group(s)")
    params = [p for group in current.param_groups for p in group["params"]]
    for saved_group, group in zip(groups, current.param_groups):
        _expect(isinstance(saved_group, dict) and len(saved_group.get("params", ())) == len(group["params"]),
                where, f"{len(group['params'])} parameter(s) per group")
    state = saved.get("state", {})
    _expect(isinstance(state, dict), where, "an optimiser state dict")
    for index, entry in state.items():
        _expect(isinstance(index, int) and 0 <= index < len(params) and isinstance(entry, dict), where,
                f"per-parameter state for parameters 0..{len(params) - 1}")
        for key, value in entry.items():
            # Per-element moments (momentum, Adam's averages) have the parameter's shape; counters are scalars.
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                if tuple(value.shape) != tuple(params[index].shape):
                    raise StateError(f"{where}.state[{index}][{key!r}]: shape {tuple(value.shape)}, parameter "
                                     f"{tuple(params[index].shape)}")
