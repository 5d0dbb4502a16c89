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

What a parked client owns (its tensors no other client shares, and tensors held in its
``persistent_attrs``: control variates and the like) is counted by the run's client-state store after
each use (:mod:`flcore.clients.state_store`). When the store is over its budget it has the least recently
used client :meth:`~ParkingClient.spill` them to a file: the client keeps shape-only stand-ins, and reads
its tensors back before anything of its state is used again (a module checked out, tensors read or set,
a spilled attribute read). Only :meth:`~ParkingClient.module_state` and
:meth:`~ParkingClient.spilled_value`, which a checkpoint reads, leave a spilled client as it is.
"""
from __future__ import annotations

import copy
from typing import Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from flcore.aggregation import named_tensors
from flcore.clients.parked_modules import (FrozenTensors, ModuleTemplate, ParkedModule, Tensors, frozen_state,
                                          load_module, park_module, parkable, parked_copy, rebind, same_bits,
                                          swap_parameters, template_for, tensor_key)
from flcore.clients.state_store import ClientStateStore, SpillRecord

# Keys of a spilled client's file: "module/<slot>/<tensor name>" and "attr/<attribute>[/<key>]".
_MODULE_KEY, _ATTR_KEY = "module", "attr"


class ParkingClient:
    """The part of a client that keeps its modules parked between uses (see the module docstring).

    Any attribute holding a module with tensors is parked; reading it checks it out again. Optimisers
    held in attributes follow their parameters. Subclasses set ``_parked`` and ``_live`` first thing."""

    _parked: Dict[str, ParkedModule]
    # checked-out slot -> (template, the tensors loaded, which of them were the client's own)
    _live: Dict[str, Tuple[ModuleTemplate, Tensors, set]]
    _store: Optional[ClientStateStore]    # the run's client-state store (None: nothing is ever spilled)
    _spill: Optional[SpillRecord]         # where the own tensors are while spilled
    _spilled_attrs: Dict[str, object]     # attribute -> its shape-only stand-in while spilled
    _touched: bool                        # used since the store last counted it

    def _start_parking(self, store: Optional[ClientStateStore] = None) -> None:
        for name, value in (("_parked", {}), ("_live", {}), ("_store", store), ("_spill", None),
                            ("_spilled_attrs", {}), ("_touched", False)):
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str):
        state = self.__dict__
        if name in state.get("_spilled_attrs", ()):
            self._read_back()
            return state[name]
        parked = state.get("_parked")
        if parked is None or name not in parked:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return self._check_out(name)

    def __setattr__(self, name: str, value) -> None:
        state = self.__dict__
        if name in state.get("_spilled_attrs", ()):
            self._read_back()
        parked = state.get("_parked")
        if parked and name in parked:
            del parked[name]
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        if name in self.__dict__.get("_spilled_attrs", ()):
            self._read_back()
        parked = self.__dict__.get("_parked")
        if parked and name in parked:
            del parked[name]
        else:
            object.__delattr__(self, name)

    def hold_copy(self, slot: str, module: nn.Module) -> None:
        """Give the client a copy of ``module`` as attribute ``slot``, parked: its tensors shared with every
        client given the same, unchanged module."""
        self._read_back()
        self.__dict__.pop(slot, None)
        self._live.pop(slot, None)
        self._parked[slot] = parked_copy(module, frozen_state(module))

    def _check_out(self, slot: str) -> nn.Module:
        self._read_back()
        parked = self._parked.pop(slot)
        module = load_module(parked)
        self.__dict__[slot] = module
        self._live[slot] = (parked.template, dict(parked.tensors), set(parked.own))
        params = dict(module.named_parameters())
        template = parked.template

        def swap(param):
            owner = template.owner(param)
            return params[owner[1]] if owner is not None and owner[0] == slot else param
        swap_parameters(self, swap)
        return module

    def check_out_all(self) -> None:
        """Check every parked module out (a copy of the client that travels then holds plain modules)."""
        self._read_back()
        for slot in list(self._parked):
            self._check_out(slot)

    def is_parked(self, slot: str = "model") -> bool:
        return slot in self._parked

    def has_live_modules(self) -> bool:
        """Whether any module attribute is checked out (or was set and never parked)."""
        return any(parkable(value) for value in vars(self).values())

    def needs_parking(self) -> bool:
        """Whether a module is checked out, or tensors were set since the store last counted the client
        (a broadcast received while parked: what it owns shrank)."""
        return self._touched or self.has_live_modules()

    def park(self) -> Dict[tuple, torch.Tensor]:
        """Park every module attribute (see the module docstring); returns, for :func:`rebind`, each
        working tensor's key and the tensor the client kept in its place."""
        moved: Dict[tuple, torch.Tensor] = {}
        seen: Dict[int, str] = {}
        slots = [(slot, value) for slot, value in vars(self).items() if parkable(value)]
        used = bool(slots)  # a module was checked out: the client counts as just used (see the store's LRU)
        # Gradients first: parking copies what the client owns, and those copies are the peak of a round
        # where every slot's gradients are still held beside them. (An update that carries gradients holds
        # its own references to them.)
        for _, value in slots:
            for param in value.parameters():
                param.grad = None
        for slot, value in slots:
            for tensor in named_tensors(value).values():
                if seen.setdefault(id(tensor), slot) != slot:
                    raise RuntimeError(f"client attributes {seen[id(tensor)]!r} and {slot!r} hold the same "
                                       f"tensors; a client's modules must each own theirs")
            template, reference, own = self._live.pop(slot, (None, {}, set()))
            template = template or template_for(value)
            parked = park_module(value, template, reference, own, self._make_room)
            working = named_tensors(value)
            moved.update((tensor_key(working[name]), parked.tensors[name]) for name in working)
            ids = {id(p): name for name, p in value.named_parameters()}
            swap_parameters(self, lambda p: template.stand_in(slot, ids[id(p)], p) if id(p) in ids else p)
            del self.__dict__[slot]
            self._parked[slot] = parked
            template.release(value)
        self._live.clear()
        if (used or self._touched) and self._store is not None:
            self._store.note(self, used)
        self._touched = False
        return moved

    def _make_room(self, nbytes: int) -> None:
        """``nbytes`` more of this client's own are about to be made: the store spills others first."""
        if self._store is not None:
            self._store.make_room(nbytes, keep=self)

    def release(self, update=None):
        """Park, and move ``update``'s tensors (views of the working modules) onto what the client kept."""
        moved = self.park()
        if update is not None and moved:
            for part in (update.tensors, update.gradients, update.extras):
                rebind(part, moved)
        return update

    def module_tensors(self, slot: str = "model") -> Tensors:
        """Every tensor of module ``slot`` by name, without checking it out (never write them)."""
        self._read_back()
        if slot in self._parked:
            return dict(self._parked[slot].tensors)
        return named_tensors(getattr(self, slot))

    def receive_tensors(self, values: Mapping[str, torch.Tensor], slot: str = "model",
                        frozen: Optional[bool] = None) -> None:
        """Set tensors of module ``slot`` by full name, as ``copy_`` into them would. ``frozen`` (default:
        ``values`` is a :class:`FrozenTensors`): nobody writes them any more, so a parked client keeps
        references, not copies."""
        frozen = isinstance(values, FrozenTensors) if frozen is None else frozen
        self._read_back()
        self._touched = True
        if slot in self._parked:
            parked = self._parked[slot]
            tensors = parked.tensors
            for name, value in values.items():
                if name not in tensors:
                    raise KeyError(f"{name!r} is not a parameter or buffer of {slot}")
                current = tensors[name]
                same_kind = (value.shape == current.shape and value.dtype == current.dtype
                             and value.device == current.device)
                if frozen and same_kind:
                    # The tensor itself, not a view per client: a view object is about 280 bytes, 35 KB a
                    # client for ResNet18's 122 tensors.
                    tensors[name] = value.detach() if value.requires_grad else value
                    parked.own.discard(name)
                else:
                    tensors[name] = torch.empty_like(current).copy_(value)
                    parked.own.add(name)
            return
        module = getattr(self, slot)
        target = named_tensors(module)
        with torch.no_grad():
            for name, value in values.items():
                if name not in target:
                    raise KeyError(f"{name!r} is not a parameter or buffer of {type(module).__name__}")
                target[name].copy_(value)
        if frozen and slot in self._live:
            _, reference, own = self._live[slot]
            reference.update((name, value.detach()) for name, value in values.items())
            own.difference_update(values)

    def shared_references(self) -> Tuple[List[ModuleTemplate], List[torch.Tensor]]:
        """The templates of its parked modules, and the tensors it holds without owning them: parked
        tensors shared with other clients and the values of its :class:`FrozenTensors` attributes (what
        :class:`~flcore.executors.shipping.SharedTable` sends once for many clients)."""
        templates, shared = [], []
        for parked in self._parked.values():
            templates.append(parked.template)
            shared.extend(t for name, t in parked.tensors.items() if name not in parked.own)
        for value in vars(self).values():
            if isinstance(value, FrozenTensors):
                shared.extend(value.values())
        return templates, shared

    def detached(self) -> "ParkingClient":
        """A shallow copy, parked and read back from the store, sharing this client's parked modules and
        using no store (what travels to a worker; the executor sets its data there)."""
        self.park()
        self._read_back()
        copied = copy.copy(self)
        copied._start_parking()
        copied._parked.update(self._parked)
        return copied

    def module_state(self, slot: str) -> Optional[Tensors]:
        """The ``state_dict`` of module ``slot`` while it is parked (never write it), else None. A spilled
        client is left spilled: its own tensors are shape-only stand-ins here (a checkpoint names the file)."""
        parked = self._parked.get(slot)
        return None if parked is None else parked.state_dict()

    def spilled_value(self, name: str):
        """The shape-only stand-in of attribute ``name`` while it is spilled, else None."""
        return self._spilled_attrs.get(name)

    def load_module_state(self, slot: str, state: Mapping[str, torch.Tensor]) -> None:
        """Load ``state`` (a ``state_dict``, checked) into parked module ``slot``, keeping references to its
        tensors (they must be nobody else's to write, so they count as the client's own), except where the
        bits are those held already."""
        self._read_back()
        self._touched = True
        parked = self._parked[slot]
        for name, value in state.items():
            if not same_bits(value, parked.tensors[name]):
                parked.tensors[name] = value
                parked.own.add(name)

    # ----- the client-state store ---------------------------------------------------------------
    def use_store(self, store: Optional[ClientStateStore]) -> None:
        object.__setattr__(self, "_store", store)

    def _own_attributes(self) -> Dict[str, object]:
        """Persistent attributes holding tensors (a tensor, or a dict of them) that are the client's own: not
        a :class:`FrozenTensors` shared with other clients (SCAFFOLD's zeros, the server's control)."""
        found = {}
        for name in getattr(self, "persistent_attrs", ()):
            value = self.__dict__.get(name)
            if isinstance(value, FrozenTensors):
                continue
            if isinstance(value, torch.Tensor) or (isinstance(value, dict) and value
                                                    and all(isinstance(v, torch.Tensor) for v in value.values())):
                found[name] = value
        return found

    def own_tensors(self) -> Tensors:
        """What the client owns, by its key in a spill file (see ``_MODULE_KEY``); empty while spilled."""
        if self._spill is not None:
            return {}
        own = {f"{_MODULE_KEY}/{slot}/{name}": t for slot, parked in self._parked.items()
               for name, t in parked.own_tensors().items()}
        for name, value in self._own_attributes().items():
            if isinstance(value, torch.Tensor):
                own[f"{_ATTR_KEY}/{name}"] = value
            else:
                own.update((f"{_ATTR_KEY}/{name}/{key}", t) for key, t in value.items())
        return own

    def own_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.own_tensors().values())

    def spill(self) -> None:
        """Move what the client owns to the store's file, keeping shape-only stand-ins (it is parked)."""
        own = self.own_tensors()
        if self._spill is not None or not own or self._store is None:
            return
        record = self._store.write(own)
        for parked in self._parked.values():
            for name in parked.own:
                parked.tensors[name] = _stand_in(parked.tensors[name])
        for name, value in self._own_attributes().items():
            del self.__dict__[name]
            self._spilled_attrs[name] = (_stand_in(value) if isinstance(value, torch.Tensor)
                                         else {key: _stand_in(t) for key, t in value.items()})
        self._spill = record

    def adopt_spill(self, record: SpillRecord) -> None:
        """The state just loaded (a checkpoint's) has its own tensors in ``record``'s file (checked):
        the stand-ins it loaded stay until they are read back."""
        for name, value in list(vars(self).items()):
            if name in getattr(self, "persistent_attrs", ()) and holds_stand_ins(value):
                self._spilled_attrs[name] = self.__dict__.pop(name)
        self._spill = record
        self._store.adopt(record)
        self._store.forget(self)

    def _read_back(self) -> None:
        """Read spilled tensors back from the store (a no-op unless spilled)."""
        record = self.__dict__.get("_spill")
        if record is None:
            return
        self._store.make_room(record.nbytes, keep=self)
        tensors = self._store.read(record)
        for key, tensor in tensors.items():
            kind, _, rest = key.partition("/")
            if kind == _MODULE_KEY:
                slot, _, name = rest.partition("/")
                self._parked[slot].tensors[name] = tensor
                self._parked[slot].own.add(name)
        for name, stand_in in self._spilled_attrs.items():
            value = (tensors[f"{_ATTR_KEY}/{name}"] if isinstance(stand_in, torch.Tensor)
                     else {key: tensors[f"{_ATTR_KEY}/{name}/{key}"] for key in stand_in})
            object.__setattr__(self, name, value)
        self._spilled_attrs.clear()
        self._spill = None
        self._touched = True
        self._store.released(record)


def _stand_in(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor of ``tensor``'s shape and dtype that holds no values (on the meta device)."""
    return torch.empty_like(tensor, device="meta")


def is_stand_in(tensor: torch.Tensor) -> bool:
    return tensor.device.type == "meta"


def holds_stand_ins(value) -> bool:
    """Whether ``value`` (a tensor, or dicts, lists and tuples of them) holds a stand-in anywhere."""
    if isinstance(value, torch.Tensor):
        return is_stand_in(value)
    if isinstance(value, dict):
        return any(holds_stand_ins(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(holds_stand_ins(v) for v in value)
    return False
