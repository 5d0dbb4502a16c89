"""A client's modules kept as tensors between uses (parked), and the working modules that hold them in use.

PFLlib gives every client a deep copy of the model: thousands of clients, thousands of models. Here a
client keeps each of its modules (its ``model``, and any module its method adds: Ditto's personal
model, MOON's previous base, FedROD's personal head) as a :class:`ParkedModule`: every tensor by name,
each one either the client's own or shared with other clients (the broadcast it received, the initial
model: tensors that nobody writes), with its parameters' ``requires_grad`` flags, its submodules'
train/eval modes and any plain attribute a method set on them (GPFL's class weights). A FedAvg client
after a broadcast owns no tensor at all.

Reading a parked attribute (``client.model``) checks a *working module* of its structure out of its
:class:`ModuleTemplate` (a spare one, or a new copy of the template's prototype) and loads the client's
tensors into it; the client's optimisers, which between uses hold stand-ins in place of its parameters,
are pointed at the working module's. :meth:`ParkingClient.park` does the reverse: a tensor that still
holds the bits it was loaded with (or those of the latest broadcast) stays shared, any other is copied
as the client's own, the optimisers get their stand-ins back, and the module returns to the pool.
Parking never changes a value, so every result is bit-identical to holding each module all the time.

Who parks: the executors after each client they train or evaluate, the server after building its
clients, and the round loop between the server's hooks. A working module must not be held by
reference across those points; an upload's tensors, which are views of it, are moved onto the parked
tensors by :meth:`ParkingClient.release`.
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional, Tuple

import torch
from torch import nn

from flcore.aggregation import named_tensors
from flcore.clients.parked_modules import (FrozenTensors, ModuleTemplate, ParkedModule, Tensors, frozen_state,
                                          load_module, park_module, parkable, parked_copy, rebind, same_bits,
                                          swap_parameters, template_for, tensor_key)


class ParkingClient:
    """The part of a client that keeps its modules parked between uses (see the module docstring).

    Any attribute holding a module with tensors is parked; reading it checks it out again. Optimisers
    held in attributes follow their parameters. Subclasses set ``_parked`` and ``_live`` first thing."""

    _parked: Dict[str, ParkedModule]
    _live: Dict[str, Tuple[ModuleTemplate, Tensors]]  # checked-out slot -> (template, tensors loaded)

    def _start_parking(self) -> None:
        object.__setattr__(self, "_parked", {})
        object.__setattr__(self, "_live", {})

    def __getattr__(self, name: str):
        parked = self.__dict__.get("_parked")
        if parked is None or name not in parked:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return self._check_out(name)

    def __setattr__(self, name: str, value) -> None:
        parked = self.__dict__.get("_parked")
        if parked and name in parked:
            del parked[name]
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        parked = self.__dict__.get("_parked")
        if parked and name in parked:
            del parked[name]
        else:
            object.__delattr__(self, name)

    def hold_copy(self, slot: str, module: nn.Module) -> None:
        """Give the client a copy of ``module`` as attribute ``slot``, parked: its tensors shared with every
        client given the same, unchanged module."""
        self.__dict__.pop(slot, None)
        self._live.pop(slot, None)
        self._parked[slot] = parked_copy(module, frozen_state(module))

    def _check_out(self, slot: str) -> nn.Module:
        parked = self._parked.pop(slot)
        module = load_module(parked)
        self.__dict__[slot] = module
        self._live[slot] = (parked.template, dict(parked.tensors))
        params = dict(module.named_parameters())
        template = parked.template

        def swap(param):
            owner = template.owner(param)
            return params[owner[1]] if owner is not None and owner[0] == slot else param
        swap_parameters(self, swap)
        return module

    def check_out_all(self) -> None:
        """Check every parked module out (a copy of the client that travels then holds plain modules)."""
        for slot in list(self._parked):
            self._check_out(slot)

    def is_parked(self, slot: str = "model") -> bool:
        return slot in self._parked

    def has_live_modules(self) -> bool:
        """Whether any module attribute is checked out (or was set and never parked)."""
        return any(parkable(value) for value in vars(self).values())

    def park(self) -> Dict[tuple, torch.Tensor]:
        """Park every module attribute (see the module docstring); returns, for :func:`rebind`, each
        working tensor's key and the tensor the client kept in its place."""
        moved: Dict[tuple, torch.Tensor] = {}
        seen: Dict[int, str] = {}
        for slot, value in list(vars(self).items()):
            if not parkable(value):
                continue
            for tensor in named_tensors(value).values():
                if seen.setdefault(id(tensor), slot) != slot:
                    raise RuntimeError(f"client attributes {seen[id(tensor)]!r} and {slot!r} hold the same "
                                       f"tensors; a client's modules must each own theirs")
            template, reference = self._live.pop(slot, (None, {}))
            template = template or template_for(value)
            parked = park_module(value, template, reference)
            working = named_tensors(value)
            moved.update((tensor_key(working[name]), parked.tensors[name]) for name in working)
            ids = {id(p): name for name, p in value.named_parameters()}
            swap_parameters(self, lambda p: template.stand_in(slot, ids[id(p)], p) if id(p) in ids else p)
            for param in value.parameters():
                param.grad = None
            del self.__dict__[slot]
            self._parked[slot] = parked
            template.release(value)
        self._live.clear()
        return moved

    def release(self, update=None):
        """Park, and move ``update``'s tensors (views of the working modules) onto what the client kept."""
        moved = self.park()
        if update is not None and moved:
            for part in (update.tensors, update.gradients, update.extras):
                rebind(part, moved)
        return update

    def module_tensors(self, slot: str = "model") -> Tensors:
        """Every tensor of module ``slot`` by name, without checking it out (never write them)."""
        if slot in self._parked:
            return dict(self._parked[slot].tensors)
        return named_tensors(getattr(self, slot))

    def receive_tensors(self, values: Mapping[str, torch.Tensor], slot: str = "model",
                        frozen: Optional[bool] = None) -> None:
        """Set tensors of module ``slot`` by full name, as ``copy_`` into them would. ``frozen`` (default:
        ``values`` is a :class:`FrozenTensors`): nobody writes them any more, so a parked client keeps
        references, not copies."""
        frozen = isinstance(values, FrozenTensors) if frozen is None else frozen
        if slot in self._parked:
            tensors = self._parked[slot].tensors
            for name, value in values.items():
                if name not in tensors:
                    raise KeyError(f"{name!r} is not a parameter or buffer of {slot}")
                current = tensors[name]
                same_kind = (value.shape == current.shape and value.dtype == current.dtype
                             and value.device == current.device)
                tensors[name] = value.detach() if frozen and same_kind else torch.empty_like(current).copy_(value)
            return
        module = getattr(self, slot)
        target = named_tensors(module)
        with torch.no_grad():
            for name, value in values.items():
                if name not in target:
                    raise KeyError(f"{name!r} is not a parameter or buffer of {type(module).__name__}")
                target[name].copy_(value)
        if frozen and slot in self._live:
            self._live[slot][1].update((name, value.detach()) for name, value in values.items())

    def module_state(self, slot: str) -> Optional[Tensors]:
        """The ``state_dict`` of module ``slot`` while it is parked (never write it), else None."""
        parked = self._parked.get(slot)
        return None if parked is None else parked.state_dict()

    def load_module_state(self, slot: str, state: Mapping[str, torch.Tensor]) -> None:
        """Load ``state`` (a ``state_dict``, checked) into parked module ``slot``, keeping references to its
        tensors (they must be nobody else's to write), except where the bits are those held already."""
        tensors = self._parked[slot].tensors
        for name, value in state.items():
            if not same_bits(value, tensors[name]):
                tensors[name] = value
