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

import copy
import weakref
from typing import Dict, FrozenSet, List, Mapping, Optional, Tuple

import torch
from torch import nn

from flcore.aggregation import named_tensors

Tensors = Dict[str, torch.Tensor]
# Spare working modules kept per structure: the executors use one at a time; more are made when needed.
MAX_SPARES = 2


class FrozenTensors(dict):
    """Tensors by name that nobody writes any more (a broadcast, a group's average): a client may keep
    references to them instead of copies."""


def frozen_copy_of(tensors: Mapping[str, torch.Tensor], prefix: str = "") -> FrozenTensors:
    """A :class:`FrozenTensors` copy of ``tensors``, offered as what parked clients may share (under
    their full names, ``prefix`` + name)."""
    with torch.inference_mode(False):
        frozen = FrozenTensors((name, t.detach().clone()) for name, t in tensors.items())
    for name, tensor in frozen.items():
        _RECENT[f"{prefix}.{name}" if prefix else name] = tensor
    return frozen


# The latest frozen tensor of each full name (weakly held): a tensor that holds its bits when parked is
# shared rather than copied (FedALA's lower layers, copied from the broadcast; Ditto's personal model
# before its first training, a copy of the initial model).
_RECENT: "weakref.WeakValueDictionary[str, torch.Tensor]" = weakref.WeakValueDictionary()


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same bits (so -0.0 differs from 0.0, and a NaN equals itself)."""
    if a is b:
        return True
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    if a.is_floating_point() and a.element_size() in _INTEGER_OF_SIZE:
        as_int = _INTEGER_OF_SIZE[a.element_size()]
        return torch.equal(a.view(as_int), b.view(as_int))
    return torch.equal(a, b)


_INTEGER_OF_SIZE = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _differs(value, reference) -> bool:
    """Whether a plain attribute of a submodule differs from the prototype's (tensors by identity)."""
    if value is reference:
        return False
    if isinstance(value, torch.Tensor) or isinstance(reference, torch.Tensor):
        return True
    try:
        return not (type(value) is type(reference) and bool(value == reference))
    except Exception:  # noqa: BLE001 - values that cannot say whether they are equal are kept
        return True


def _plain_attributes(module: nn.Module):
    return ((key, value) for key, value in vars(module).items() if not key.startswith("_") and key != "training")


class ModuleTemplate:
    """The working modules of one structure: a prototype never lent (spares are copies of it), the spares,
    the tensor names, and the stand-ins optimisers hold for parked parameters."""

    def __init__(self, example: nn.Module):
        self.prototype = copy.deepcopy(example)
        for param in self.prototype.parameters():
            param.grad = None
        self.names: Tuple[str, ...] = tuple(named_tensors(self.prototype))
        self.state_keys: Tuple[str, ...] = tuple(self.prototype.state_dict())
        self.spares: List[nn.Module] = []
        self._stand_ins: Dict[Tuple[str, str], torch.Tensor] = {}
        self._owners: Dict[int, Tuple[str, str]] = {}
        self._interned: Dict[object, object] = {}
        self.extra_keys: set = set()  # (submodule index, attribute) a client set on a submodule

    def acquire(self) -> nn.Module:
        if self.spares:
            return self.spares.pop()
        with torch.inference_mode(False):  # a module made under inference mode could never train
            return copy.deepcopy(self.prototype)

    def release(self, module: nn.Module) -> None:
        if len(self.spares) < MAX_SPARES:
            self.spares.append(module)

    def stand_in(self, slot: str, name: str, param: torch.Tensor) -> torch.Tensor:
        """What an optimiser holds for parameter ``name`` of the client's ``slot`` while it is parked: one
        zero expanded to the parameter's shape, shared by every client (so optimiser states still load
        and check against the right shapes and dtypes)."""
        key = (slot, name)
        stand_in = self._stand_ins.get(key)
        if stand_in is None:
            stand_in = torch.zeros((), dtype=param.dtype, device=param.device).expand(param.shape)
            self._stand_ins[key] = stand_in
            self._owners[id(stand_in)] = key
        return stand_in

    def owner(self, tensor: torch.Tensor) -> Optional[Tuple[str, str]]:
        """``(slot, name)`` of a stand-in of this template, None for any other tensor."""
        key = self._owners.get(id(tensor))
        return key if key is not None and self._stand_ins.get(key) is tensor else None

    def intern(self, value):
        """One shared object per distinct flag set, so that thousands of clients hold one each."""
        return self._interned.setdefault(value, value)


_TEMPLATES: "weakref.WeakValueDictionary[tuple, ModuleTemplate]" = weakref.WeakValueDictionary()


def template_for(module: nn.Module) -> ModuleTemplate:
    """The template of ``module``'s structure (submodule types, tensor names, shapes, layouts, dtypes)."""
    key = (tuple((name, type(sub)) for name, sub in module.named_modules()),
           tuple((name, tuple(t.shape), t.stride(), t.dtype, str(t.device), isinstance(t, nn.Parameter))
                 for name, t in named_tensors(module).items()))
    template = _TEMPLATES.get(key)
    if template is None:
        template = ModuleTemplate(module)
        _TEMPLATES[key] = template
    return template


class ParkedModule:
    """A module as tensors: ``tensors`` (every parameter and buffer by name, never written), the names of
    the parameters that take no gradient, each submodule's train/eval mode, and plain attributes set on
    submodules, as ``((submodule index, name), value)`` pairs."""
    __slots__ = ("template", "tensors", "frozen", "modes", "extras")

    def __init__(self, template: ModuleTemplate, tensors: Tensors, frozen: FrozenSet[str],
                 modes: Tuple[bool, ...], extras: tuple = ()):
        self.template, self.tensors, self.frozen, self.modes, self.extras = template, tensors, frozen, modes, extras

    def state_dict(self) -> Tensors:
        """Its tensors under the keys and in the order of the module's ``state_dict()``."""
        return {key: self.tensors[key] for key in self.template.state_keys}


def park_module(module: nn.Module, template: ModuleTemplate, reference: Mapping[str, torch.Tensor]) -> ParkedModule:
    """``module`` as a :class:`ParkedModule`: a tensor with the bits of ``reference[name]`` (what it was
    loaded with) or of the latest frozen tensor of that name is shared, any other copied."""
    tensors: Tensors = {}
    with torch.inference_mode(False), torch.no_grad():
        for name, tensor in named_tensors(module).items():
            tensor = tensor.detach()
            kept = reference.get(name)
            if kept is None or not same_bits(tensor, kept):
                kept = _RECENT.get(name)
                if kept is None or not same_bits(tensor, kept):
                    kept = tensor.clone()
            tensors[name] = kept
    return ParkedModule(template, tensors, *_flags(module, template))


def _flags(module: nn.Module, template: ModuleTemplate) -> tuple:
    """``(frozen, modes, extras)`` of ``module`` for a :class:`ParkedModule` (see there)."""
    frozen = template.intern(frozenset(n for n, p in module.named_parameters() if not p.requires_grad))
    modes = template.intern(tuple(sub.training for sub in module.modules()))
    extras = []
    for index, (sub, original) in enumerate(zip(module.modules(), template.prototype.modules())):
        reference_attrs = vars(original)
        for key, value in _plain_attributes(sub):
            if _differs(value, reference_attrs.get(key)):
                extras.append(((index, key), value))
                template.extra_keys.add((index, key))
    return frozen, modes, tuple(extras)


def load_module(parked: ParkedModule) -> nn.Module:
    """A working module holding ``parked``'s values, flags, modes and attributes."""
    template = parked.template
    module = template.acquire()
    with torch.inference_mode(False), torch.no_grad():
        for name, tensor in named_tensors(module).items():
            tensor.copy_(parked.tensors[name])
    for name, param in module.named_parameters():
        param.grad = None
        param.requires_grad_(name not in parked.frozen)
    submodules = list(module.modules())
    for sub, mode in zip(submodules, parked.modes):
        sub.training = mode
    if template.extra_keys:
        prototypes = list(template.prototype.modules())
        own = dict(parked.extras)
        for index, key in template.extra_keys:
            setattr(submodules[index], key, own.get((index, key), vars(prototypes[index]).get(key)))
    return module


def parked_copy(module: nn.Module, tensors: Tensors) -> ParkedModule:
    """A parked module of ``module``'s structure, flags and modes holding ``tensors`` (frozen ones)."""
    template = template_for(module)
    return ParkedModule(template, dict(tensors), *_flags(module, template))


def _optimizers(owner) -> list:
    return [value for value in vars(owner).values() if isinstance(value, torch.optim.Optimizer)]


def _swap_parameters(owner, swap) -> None:
    """Replace, in every optimiser of ``owner``, each parameter ``p`` (and its state's key) by ``swap(p)``."""
    for optimizer in _optimizers(owner):
        for group in optimizer.param_groups:
            params = group["params"]
            for i, param in enumerate(params):
                params[i] = swap(param)
        for param in list(optimizer.state):
            other = swap(param)
            if other is not param:
                optimizer.state[other] = optimizer.state.pop(param)


def _key(tensor: torch.Tensor) -> tuple:
    return tensor.data_ptr(), tuple(tensor.shape), tensor.stride(), tensor.dtype, str(tensor.device)


def rebind(value, moved: Mapping[tuple, torch.Tensor]):
    """``value`` (a tensor, or dicts and lists of them) with every view of a parked working tensor
    replaced, in place where it sits in a container, by the tensor the client kept."""
    if isinstance(value, torch.Tensor):
        return moved.get(_key(value), value)
    if isinstance(value, dict):
        for name, item in value.items():
            new = rebind(item, moved)
            if new is not item:
                value[name] = new
    elif isinstance(value, list):
        for i, item in enumerate(value):
            new = rebind(item, moved)
            if new is not item:
                value[i] = new
    return value


def _parkable(value) -> bool:
    return isinstance(value, nn.Module) and next(iter(named_tensors(value).values()), None) is not None


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
        self._parked[slot] = parked_copy(module, _frozen_state(module))

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
        _swap_parameters(self, swap)
        return module

    def is_parked(self, slot: str = "model") -> bool:
        return slot in self._parked

    def has_live_modules(self) -> bool:
        """Whether any module attribute is checked out (or was set and never parked)."""
        return any(_parkable(value) for value in vars(self).values())

    def park(self) -> Dict[tuple, torch.Tensor]:
        """Park every module attribute (see the module docstring); returns, for :func:`rebind`, each
        working tensor's key and the tensor the client kept in its place."""
        moved: Dict[tuple, torch.Tensor] = {}
        seen: Dict[int, str] = {}
        for slot, value in list(vars(self).items()):
            if not _parkable(value):
                continue
            for tensor in named_tensors(value).values():
                if seen.setdefault(id(tensor), slot) != slot:
                    raise RuntimeError(f"client attributes {seen[id(tensor)]!r} and {slot!r} hold the same "
                                       f"tensors; a client's modules must each own theirs")
            template, reference = self._live.pop(slot, (None, {}))
            template = template or template_for(value)
            parked = park_module(value, template, reference)
            working = named_tensors(value)
            moved.update((_key(working[name]), parked.tensors[name]) for name in working)
            ids = {id(p): name for name, p in value.named_parameters()}
            _swap_parameters(self, lambda p: template.stand_in(slot, ids[id(p)], p) if id(p) in ids else p)
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


_FROZEN_STATES: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()


def _frozen_state(module: nn.Module) -> Tensors:
    """A frozen copy of ``module``'s tensors, made once for as long as the module does not change (the
    global model every client of a server is built from)."""
    tensors = named_tensors(module)
    stamp = tuple((t.data_ptr(), t._version) for t in tensors.values())
    found = _FROZEN_STATES.get(module)
    if found is None or found[0] != stamp:
        found = (stamp, frozen_copy_of(tensors))
        _FROZEN_STATES[module] = found
    return found[1]
