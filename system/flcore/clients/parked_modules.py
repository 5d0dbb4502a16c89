"""The pieces a parked client is made of: tensors nobody writes (:class:`FrozenTensors`), a module kept as
tensors (:class:`ParkedModule`) and the templates and pools its working modules come from
(:class:`ModuleTemplate`). :mod:`flcore.clients.parking` puts them together for a client."""
from __future__ import annotations

import copy
import weakref
from typing import AbstractSet, Callable, Dict, FrozenSet, List, Mapping, Optional, Tuple

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
        # A working module is loaded with a client's tensors before any use, so the prototype's values are
        # never read: it holds none (shape-only tensors), and a new working module gets memory on the
        # devices the example's tensors were on.
        self.devices: Dict[str, torch.device] = {name: t.device for name, t in named_tensors(example).items()}
        self.prototype = _copy_with_blanks(example, lambda name: torch.device("meta"))
        self.names: Tuple[str, ...] = tuple(named_tensors(self.prototype))
        self.state_keys: Tuple[str, ...] = tuple(self.prototype.state_dict())
        self.spares: List[nn.Module] = []
        self._stand_ins: Dict[Tuple[str, str], torch.Tensor] = {}
        self._owners: Dict[int, Tuple[str, str]] = {}
        self._interned: Dict[object, object] = {}
        self.extra_keys: set = set()  # (submodule index, attribute) a client set on a submodule
        self._shapes: Optional[Tensors] = None

    def __getstate__(self) -> dict:
        # A copy (a worker's, see flcore.executors.shipping) gets no spares, and finds its own stand-ins.
        state = dict(self.__dict__, spares=[], _shapes=None)
        del state["_owners"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._owners = {id(stand_in): key for key, stand_in in self._stand_ins.items()}

    def acquire(self) -> nn.Module:
        if self.spares:
            return self.spares.pop()
        return _copy_with_blanks(self.prototype, self.devices.__getitem__)

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
            stand_in = torch.zeros((), dtype=param.dtype, device=self.devices[name]).expand(param.shape)
            self._stand_ins[key] = stand_in
            self._owners[id(stand_in)] = key
        return stand_in

    def shapes(self) -> Tensors:
        """The prototype's shape-only tensors by name: each working tensor's shape, dtype and layout."""
        if self._shapes is None:
            self._shapes = named_tensors(self.prototype)
        return self._shapes

    def fits(self, module: nn.Module) -> bool:
        """Whether ``module``'s tensors have this structure's names, shapes, dtypes and devices."""
        shapes, tensors = self.shapes(), named_tensors(module)
        return len(tensors) == len(shapes) and all(
            name in shapes and t.shape == shapes[name].shape and t.dtype == shapes[name].dtype
            and t.device == self.devices[name] for name, t in tensors.items())

    def owner(self, tensor: torch.Tensor) -> Optional[Tuple[str, str]]:
        """``(slot, name)`` of a stand-in of this template, None for any other tensor."""
        key = self._owners.get(id(tensor))
        return key if key is not None and self._stand_ins.get(key) is tensor else None

    def intern(self, value):
        """One shared object per distinct flag set, so that thousands of clients hold one each."""
        return self._interned.setdefault(value, value)


def _copy_with_blanks(module: nn.Module, device_of: Callable[[str], torch.device]) -> nn.Module:
    """A deep copy of ``module`` whose parameters and buffers are new, uninitialised tensors on
    ``device_of(name)`` (shapes, strides and ``requires_grad`` kept, no gradient): no value is copied, and
    a tensor two submodules share stays one tensor."""
    memo = {}
    with torch.inference_mode(False):  # a module made under inference mode could never train
        for name, tensor in named_tensors(module).items():
            blank = torch.empty_like(tensor.detach(), device=device_of(name))
            memo[id(tensor)] = nn.Parameter(blank, tensor.requires_grad) if isinstance(tensor, nn.Parameter) else blank
        return copy.deepcopy(module, memo)


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
    """A module as tensors: ``tensors`` (parameters and buffers by name, never written), the names of the
    parameters that take no gradient, each submodule's train/eval mode, and plain attributes set on
    submodules, as ``((submodule index, name), value)`` pairs. ``own``: the names whose tensors are this
    client's alone (copies it made or was given), not shared with others. :func:`park_module` makes one
    holding every tensor; a parked client keeps the shared ones here and its own in the client-state store
    (:mod:`flcore.clients.parking`)."""
    __slots__ = ("template", "tensors", "frozen", "modes", "extras", "own")

    def __init__(self, template: ModuleTemplate, tensors: Tensors, frozen: FrozenSet[str],
                 modes: Tuple[bool, ...], extras: tuple = (), own: Optional[set] = None):
        self.template, self.tensors, self.frozen, self.modes, self.extras = template, tensors, frozen, modes, extras
        self.own = set() if own is None else own


def park_module(module: nn.Module, template: ModuleTemplate, reference: Mapping[str, torch.Tensor],
                reference_own: AbstractSet[str] = frozenset(),
                make_room: Optional[Callable[[int], None]] = None) -> ParkedModule:
    """``module`` as a :class:`ParkedModule`: a tensor with the bits of ``reference[name]`` (what it was
    loaded with, the client's own where ``reference_own`` names it) or of the latest frozen tensor of that
    name is kept by reference, any other copied as the client's own. ``make_room(nbytes)`` is told what the
    copies will take before they are made (the client-state store spills others first)."""
    tensors: Tensors = {}
    own = set()
    copies = []
    with torch.inference_mode(False), torch.no_grad():
        for name, tensor in named_tensors(module).items():
            tensor = tensor.detach()
            kept = reference.get(name)
            if kept is not None and same_bits(tensor, kept):
                if name in reference_own:
                    own.add(name)
            else:
                kept = _RECENT.get(name)
                if kept is None or not same_bits(tensor, kept):
                    copies.append(name)
                    kept = tensor
                    own.add(name)
            tensors[name] = kept
        if make_room is not None and copies:
            make_room(sum(tensors[name].numel() * tensors[name].element_size() for name in copies))
        for name in copies:
            tensors[name] = tensors[name].clone()
    return ParkedModule(template, tensors, *_flags(module, template), own=own)


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


def load_module(parked: ParkedModule, tensors: Optional[Mapping[str, torch.Tensor]] = None) -> nn.Module:
    """A working module holding ``tensors`` (default: ``parked``'s own) and ``parked``'s flags, modes and
    attributes."""
    template = parked.template
    values = parked.tensors if tensors is None else tensors
    module = template.acquire()
    with torch.inference_mode(False), torch.no_grad():
        for name, tensor in named_tensors(module).items():
            tensor.copy_(values[name])
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


def swap_parameters(owner, swap) -> None:
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


def tensor_key(tensor: torch.Tensor) -> tuple:
    return tensor.data_ptr(), tuple(tensor.shape), tensor.stride(), tensor.dtype, str(tensor.device)


def rebind(value, moved: Mapping[tuple, torch.Tensor]):
    """``value`` (a tensor, or dicts and lists of them) with every view of a parked working tensor
    replaced, in place where it sits in a container, by the tensor the client kept."""
    if isinstance(value, torch.Tensor):
        return moved.get(tensor_key(value), value)
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


def parkable(value) -> bool:
    return isinstance(value, nn.Module) and next(iter(named_tensors(value).values()), None) is not None


_FROZEN_STATES: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()


def frozen_state(module: nn.Module) -> Tensors:
    """A frozen copy of ``module``'s tensors, made once for as long as the module does not change (the
    global model every client of a server is built from)."""
    tensors = named_tensors(module)
    stamp = tuple((t.data_ptr(), t._version) for t in tensors.values())
    found = _FROZEN_STATES.get(module)
    if found is None or found[0] != stamp:
        found = (stamp, frozen_copy_of(tensors))
        _FROZEN_STATES[module] = found
    return found[1]
