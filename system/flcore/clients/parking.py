"""Where a client's tensors are, at every moment, and the two moves between those places.

PFLlib gives every client a deep copy of the model: thousands of clients, thousands of models. Here a
client's modules (its ``model``, and any module its method adds: Ditto's personal model, MOON's previous
base, FedROD's personal head) and its own tensor attributes (control variates ...) are in one of two places:

* **in use** (between :meth:`ParkingClient.check_out` and :meth:`~ParkingClient.park`): plain attributes of
  the client, ``self.model`` a working module from its structure's pool (:class:`ModuleTemplate`), its
  optimisers pointing at that module's parameters. Algorithm code runs here: the executors check a client
  out, run its hooks, and park it.
* **parked** (any other time): for each module a :class:`ParkedModule` on the client, which holds its
  structure, flags and modes and references to the tensors it shares with other clients (the broadcast
  it received, the initial model: tensors nobody writes); and, in the run's client-state store
  (:mod:`flcore.clients.state_store`), one entry of what is the client's own alone, ``{key: tensor}`` with
  keys ``module/<slot>/<name>`` and ``attr/<attribute>[/<key>]``, in memory or spilled to a file. The
  optimisers hold stand-ins in place of the parameters. A FedAvg client after a broadcast owns nothing: it
  has no entry.

Parking never changes a value: a tensor that still holds the bits it was checked out with (or those of
the latest broadcast) stays shared, any other is copied as the client's own, so every result is
bit-identical to holding each module all the time. The server delivers what a client receives into its
parked modules (:meth:`~ParkingClient.receive_tensors`: references to frozen tensors, no copies). Who parks:
the executors after each client they train or evaluate, the server after building its clients, and the
round loop between the server's hooks (a hook may use any client; none stays in use beyond it). A working
module must not be held by reference across those points; an upload's tensors, which are views of it, are
moved onto the parked tensors by :meth:`~ParkingClient.release`.
"""
from __future__ import annotations

import copy
from typing import Dict, Iterator, List, Mapping, Optional, Tuple

import torch
from torch import nn

from flcore.aggregation import named_tensors
from flcore.clients.parked_modules import (FrozenTensors, ModuleTemplate, ParkedModule, Tensors, frozen_state,
                                          load_module, park_module, parkable, parked_copy, rebind, same_bits,
                                          swap_parameters, template_for, tensor_key)
from flcore.clients.spill_files import SpillRecord
from flcore.clients.state_store import ClientStateStore

# Keys of a client's entry in the store: "module/<slot>/<tensor name>" and "attr/<attribute>[/<key>]".
_MODULE_KEY, _ATTR_KEY = "module", "attr"


def module_key(slot: str, name: str) -> str:
    return f"{_MODULE_KEY}/{slot}/{name}"


class ParkingClient:
    """The part of a client that keeps its modules parked between uses (see the module docstring).

    Any attribute holding a module with tensors is parked. Nothing checks a client out behind the code's back:
    while it is parked its modules and own tensor attributes are simply not attributes (reading one is an
    ``AttributeError``), and whoever uses it calls :meth:`check_out` first (the executors, and a server hook
    through :meth:`Server.in_use`). Subclasses call :meth:`_start_parking` first thing."""

    _parked: Dict[str, ParkedModule]
    # checked-out slot -> (template, the tensors loaded, which of them were the client's own)
    _live: Dict[str, Tuple[ModuleTemplate, Tensors, set]]
    _store: ClientStateStore
    _taken: Optional[Tensors]  # its store entry while in use (out of the table), else None

    def _start_parking(self, store: Optional[ClientStateStore] = None) -> None:
        for name, value in (("_parked", {}), ("_live", {}), ("_store", store or ClientStateStore()),
                            ("_taken", None)):
            object.__setattr__(self, name, value)

    # ----- the two places ------------------------------------------------------------------------
    def hold_copy(self, slot: str, module: nn.Module) -> None:
        """Give the client a copy of ``module`` as attribute ``slot``, parked: its tensors shared with every
        client given the same, unchanged module."""
        self.__dict__.pop(slot, None)
        self._live.pop(slot, None)
        self._parked[slot] = parked_copy(module, frozen_state(module))

    def check_out(self) -> None:
        """Put the client in use: every parked module becomes a working module in its attribute, and its own
        tensor attributes are attributes again (read back from the store's file if it was spilled)."""
        own = self._take()
        for slot in list(self._parked):
            parked = self._parked.pop(slot)
            tensors = {**parked.tensors, **{name: own.pop(module_key(slot, name)) for name in parked.own}}
            module = load_module(parked, tensors)
            self.__dict__[slot] = module
            self._live[slot] = (parked.template, tensors, set(parked.own))
            params = dict(module.named_parameters())
            template = parked.template

            def swap(param, slot=slot, template=template, params=params):
                owner = template.owner(param)
                return params[owner[1]] if owner is not None and owner[0] == slot else param
            swap_parameters(self, swap)
        for attr, value in _attributes_of(own).items():
            if attr not in self.__dict__:  # one set while parked is newer than the store's
                object.__setattr__(self, attr, value)
        self._taken = {}

    def _take(self) -> Tensors:
        """Its entry, out of the store (and what it took out before, if it is in use already)."""
        if self._taken is None:
            self._taken = self._store.take(self.id)
        return self._taken

    def is_parked(self, slot: str = "model") -> bool:
        return slot in self._parked

    def has_live_modules(self) -> bool:
        """Whether any module attribute is in use (or was set and never parked)."""
        return any(parkable(value) for value in vars(self).values())

    def needs_parking(self) -> bool:
        """Whether the client is in use (checked out, or a module set and never parked)."""
        return self._taken is not None or self.has_live_modules()

    def park(self) -> Dict[tuple, torch.Tensor]:
        """Park every module attribute and give the store the client's own tensors (see the module
        docstring); returns, for :func:`rebind`, each working tensor's key and the tensor kept in its place."""
        moved: Dict[tuple, torch.Tensor] = {}
        seen: Dict[int, str] = {}
        slots = [(slot, value) for slot, value in vars(self).items() if parkable(value)]
        attributes = self._own_attributes()
        # An attribute set while parked (SCAFFOLD's received control) replaces what the store held for it.
        replaced = {key for key in (self._store.keys(self.id) if self._taken is None else self._taken)
                    if _attribute_of(key) in self.__dict__}
        if not slots and not attributes and not replaced and self._taken is None:
            return moved  # parked already
        used = bool(slots) or self._taken is not None
        # What it owns already: out of the store while in use, else (an attribute set on a parked client) its
        # entry there, to which the new values are added.
        own = self._taken if self._taken is not None else self._store.get(self.id)
        for key in replaced:
            del own[key]
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
            template, reference, own_before = self._live.pop(slot, (None, {}, set()))
            if template is None or not template.fits(value):  # set anew, or changed in use (.double())
                template = template_for(value)
            parked = park_module(value, template, reference, own_before,
                                 lambda nbytes: self._store.make_room(nbytes, keep=self.id))
            working = named_tensors(value)
            moved.update((tensor_key(working[name]), parked.tensors[name]) for name in working)
            for name in parked.own:
                own[module_key(slot, name)] = parked.tensors.pop(name)
            ids = {id(p): name for name, p in value.named_parameters()}
            swap_parameters(self, lambda p: template.stand_in(slot, ids[id(p)], p) if id(p) in ids else p)
            del self.__dict__[slot]
            self._parked[slot] = parked
            template.release(value)
        self._live.clear()
        for attr, value in attributes.items():
            own.update(_attribute_keys(attr, value))
            del self.__dict__[attr]
        self._taken = None
        self._store.put(self.id, own, used=used)
        return moved

    def release(self, update=None):
        """Park, and move ``update``'s tensors (views of the working modules) onto what the client kept."""
        moved = self.park()
        if update is not None:
            parts = (update.tensors, update.gradients, update.extras)
            if moved:
                for part in parts:
                    rebind(part, moved)
            # What else it owns may spill while the upload is pending (the store decides).
            self._store.held_by_upload(self.id, _tensors_in(parts))
        return update

    # ----- reading and setting tensors of a parked client -------------------------------------------
    def module_tensors(self, slot: str = "model") -> Tensors:
        """Every tensor of module ``slot`` by name, without checking it out (never write them)."""
        if slot in self._parked:
            return self._parked_values(slot, self._entry())
        return named_tensors(getattr(self, slot))

    def _entry(self) -> Tensors:
        """Its own tensors as they are now (read back from the store's file if spilled)."""
        return self._taken if self._taken is not None else self._store.get(self.id)

    def _parked_values(self, slot: str, own: Mapping[str, torch.Tensor]) -> Tensors:
        parked = self._parked[slot]
        return {name: parked.tensors[name] if name in parked.tensors else own[module_key(slot, name)]
                for name in parked.template.names}

    def receive_tensors(self, values: Mapping[str, torch.Tensor], slot: str = "model",
                        frozen: Optional[bool] = None) -> None:
        """Set tensors of module ``slot`` by full name, as ``copy_`` into them would. ``frozen`` (default:
        ``values`` is a :class:`FrozenTensors`): nobody writes them any more, so a parked client keeps
        references, not copies."""
        frozen = isinstance(values, FrozenTensors) if frozen is None else frozen
        if slot not in self._parked:
            self._receive_live(values, slot, frozen)
            return
        parked = self._parked[slot]
        template = parked.template
        shapes = template.shapes()
        kept, copied = {}, {}
        for name, value in values.items():
            if name not in shapes:
                raise KeyError(f"{name!r} is not a parameter or buffer of {slot}")
            # The template says what the tensor is like, so a spilled client need not read its own ones back.
            like = shapes[name]
            same_kind = (value.shape == like.shape and value.dtype == like.dtype
                         and value.device == template.devices[name])
            if frozen and same_kind:
                # The tensor itself, not a view per client: a view object is about 280 bytes, 35 KB a client
                # for ResNet18's 122 tensors.
                kept[name] = value.detach() if value.requires_grad else value
            else:
                copied[name] = torch.empty_like(like, device=template.devices[name]).copy_(value)
        parked.tensors.update(kept)
        self._change_own(slot, drop=set(kept) & parked.own, add=copied)

    def _change_own(self, slot: str, drop: set, add: Mapping[str, torch.Tensor]) -> None:
        """Names ``drop`` of module ``slot`` are shared now, ``add``'s the client's own (a recount in the store,
        not a use: its place there stays)."""
        if not drop and not add:
            return
        parked = self._parked[slot]
        entry = self._entry() if self._taken is None else self._taken
        for name in drop:
            entry.pop(module_key(slot, name), None)
        for name, tensor in add.items():
            parked.tensors.pop(name, None)
            entry[module_key(slot, name)] = tensor
        parked.own = (parked.own - drop) | set(add)
        if self._taken is None:
            self._store.put(self.id, entry, used=False)

    def _receive_live(self, values: Mapping[str, torch.Tensor], slot: str, frozen: bool) -> None:
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
            shared.extend(parked.tensors.values())
        for value in vars(self).values():
            if isinstance(value, FrozenTensors):
                shared.extend(value.values())
        return templates, shared

    def detached(self) -> "ParkingClient":
        """A shallow copy, parked, sharing this client's parked modules and holding its own tensors in a
        store of its own (what travels to a worker; the executor sets its data there)."""
        self.park()
        copied = copy.copy(self)
        copied._start_parking()
        copied._parked.update((slot, copy.copy(parked)) for slot, parked in self._parked.items())
        copied._store.put(self.id, self._store.get(self.id))
        return copied

    def module_state(self, slot: str) -> Optional[Tensors]:
        """The ``state_dict`` of module ``slot`` while it is parked (never write it), else None. A spilled
        client is left spilled: its own tensors are shape-only stand-ins here (a checkpoint names the file)."""
        parked = self._parked.get(slot)
        if parked is None:
            return None
        values = self._parked_values(slot, self._peek()[0])
        return {key: values[key] for key in parked.template.state_keys}

    def _peek(self) -> Tuple[Tensors, Optional[SpillRecord]]:
        return (self._taken, None) if self._taken is not None else self._store.peek(self.id)

    def own_attribute(self, name: str):
        """Own tensor attribute ``name`` as it is now, without checking the client out (a spilled client's
        stand-ins), or None when the client holds no such own attribute."""
        if name in self.__dict__:
            return self.__dict__[name]
        return _attributes_of(self._peek()[0]).get(name)

    def spill_record(self) -> Optional[SpillRecord]:
        """The file its own tensors are in while spilled, else None."""
        return self._peek()[1]

    def load_module_state(self, slot: str, state: Mapping[str, torch.Tensor]) -> None:
        """Load ``state`` (a ``state_dict``, checked) into parked module ``slot``, keeping references to its
        tensors (they must be nobody else's to write, so they count as the client's own), except where the
        bits are those held already."""
        current = self._parked_values(slot, self._entry())
        self._change_own(slot, drop=set(), add={name: value for name, value in state.items()
                                                  if not same_bits(value, current[name])})

    def restore_spilled(self, record: SpillRecord) -> None:
        """The state just loaded (a checkpoint's) has its own tensors, as stand-ins, in ``record``'s file
        (checked): the store keeps the entry there until it is read back."""
        entry = dict(self._taken if self._taken is not None else self._store.get(self.id))
        for attr, value in self._own_attributes().items():
            entry.update(_attribute_keys(attr, value))
            del self.__dict__[attr]
        self._taken = None
        self._store.adopt(self.id, record, entry)

    # ----- what the client owns -------------------------------------------------------------------
    def use_store(self, store: ClientStateStore) -> None:
        """Keep its own tensors in ``store`` (the run's), moving there any it holds in another."""
        entry = self._store.take(self.id) if self._store is not store else None
        object.__setattr__(self, "_store", store)
        if entry:
            store.put(self.id, entry)

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
        """What the client owns, by its key in the store (the client parked)."""
        return dict(self._peek()[0])

    def own_bytes(self) -> int:
        return self._store.owned_bytes(self.id)


def _tensors_in(value) -> Iterator[torch.Tensor]:
    """Every tensor in ``value`` (a tensor, or dicts, lists and tuples of them)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_in(item)


def _attribute_keys(attr: str, value) -> Tensors:
    """An own attribute's tensors under their store keys."""
    if isinstance(value, torch.Tensor):
        return {f"{_ATTR_KEY}/{attr}": value}
    return {f"{_ATTR_KEY}/{attr}/{key}": t for key, t in value.items()}


def _attribute_of(key: str) -> Optional[str]:
    """The attribute a store key belongs to (``attr/control/w`` -> ``control``), None for a module's."""
    kind, _, rest = key.partition("/")
    return rest.partition("/")[0] if kind == _ATTR_KEY else None


def _attributes_of(entry: Mapping[str, torch.Tensor]) -> Dict[str, object]:
    """The own attributes a store entry holds, as the client holds them (a tensor, or a dict of them)."""
    found: Dict[str, object] = {}
    for key, tensor in entry.items():
        kind, _, rest = key.partition("/")
        if kind != _ATTR_KEY:
            continue
        attr, sep, sub = rest.partition("/")
        if sep:
            found.setdefault(attr, {})[sub] = tensor
        else:
            found[attr] = tensor
    return found


def is_stand_in(tensor: torch.Tensor) -> bool:
    return tensor.device.type == "meta"


def holds_stand_ins(value) -> bool:
    """Whether ``value`` (a tensor, or dicts, lists and tuples of them) holds a stand-in anywhere."""
    return any(is_stand_in(t) for t in _tensors_in(value))
