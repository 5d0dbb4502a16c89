"""A client's minibatch objective, written once for both executors.

An :class:`Objective` is a function of the model being trained, one batch ``(x, y)`` and tensors fixed
for the round, in the style of FedJAX's ``client_step``. It reads the model only through a
:class:`ModelView`:

* ``model(x)`` / ``model(z, part="head")`` - the forward of the whole model or of one child
  (``"base"``, ``"head"``), in train mode and differentiable;
* ``model.named_parameters()`` - the trained model's parameters by name, in the model's order;
* ``model.teacher(RECEIVED, x)`` - the forward of a frozen model the client holds for the round (the
  model it received, MOON's previous base), in eval mode and without gradient;
  ``model.teacher_parameters(RECEIVED)`` its parameters by name;
* ``model.fixed(OFFSETS)`` - a tensor (or ``{name: tensor}``) the client holds for the round.

Two views implement it. :class:`LiveModel` (here) calls the client's own modules, so the sequential
path runs exactly the operations it always ran (``torch.func.functional_call`` on every step would
cost it 15-20% on the project's tiny models). ``flcore.vmapped.view.FunctionalModel`` runs the same
objective on one client's slice of parameters stacked along a client axis, under ``vmap``.

Round-fixed inputs are named by :class:`Teacher` and :class:`Fixed` handles: the client attribute
that holds them after ``begin_local_training``. :meth:`Objective.inputs` lists the handles a round
reads, so the batched engine stacks exactly those; the live view reads the attributes themselves.
An objective's hyper-parameters are its dataclass fields, so two clients' objectives compare equal
exactly when one vmapped step can train both.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Protocol, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

NamedTensors = Iterable[Tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class Teacher:
    """A frozen module the client holds in attribute ``attr`` for the round (made by ``frozen_copy``:
    eval mode, no gradients). ``part`` says which part of the client's model it has the structure of
    (``""`` the whole model, ``"base"`` for MOON's previous base): the batched engine runs it as that
    part of its model template."""
    attr: str
    part: str = ""


@dataclass(frozen=True)
class Fixed:
    """A tensor, or a ``{parameter name: tensor}`` dict, the client holds in attribute ``attr``; fixed
    for the round (FedLC's logit offsets, FedDyn's gradient estimate)."""
    attr: str


RoundInput = Union[Teacher, Fixed]


class ModelView(Protocol):
    """What an objective may read of the model it trains and of the round (see the module docstring)."""

    def __call__(self, x: torch.Tensor, part: str = "") -> torch.Tensor: ...

    def named_parameters(self) -> NamedTensors: ...

    def teacher(self, teacher: Teacher, x: torch.Tensor, part: str = "") -> torch.Tensor: ...

    def teacher_parameters(self, teacher: Teacher) -> Mapping[str, torch.Tensor]: ...

    def fixed(self, fixed: Fixed) -> Union[torch.Tensor, Mapping[str, torch.Tensor]]: ...


@dataclass(frozen=True)
class Objective:
    """A minibatch objective; subclasses are frozen dataclasses whose fields are the hyper-parameters."""

    def inputs(self) -> Tuple[RoundInput, ...]:
        """The round-fixed inputs :meth:`__call__` reads with these hyper-parameters (none by default)."""
        return ()

    def __call__(self, model: ModelView, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The scalar loss of the batch ``x`` (B, ...) with labels ``y`` (B,)."""
        raise NotImplementedError


@dataclass(frozen=True)
class CrossEntropy(Objective):
    """``CE(model(x), y)``, the batch mean: the base client's objective."""

    def __call__(self, model, x, y):
        return F.cross_entropy(model(x), y)


def squared_distance(params: NamedTensors, anchor: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``sum_l ||w_l - r_l||^2`` over ``params`` in their order; differentiable in ``params`` only."""
    return torch.stack([(param - anchor[name]).pow(2).sum() for name, param in params]).sum()


def _child(module: nn.Module, part: str) -> nn.Module:
    # A direct attribute, as ``self.model.base(x)`` always was: no path parsing on every step.
    return getattr(module, part) if part else module


class LiveModel:
    """The :class:`ModelView` of a client's own modules: ``client.model`` and the frozen models and
    tensors in its attributes, read at each call (so always the current round's)."""

    __slots__ = ("client",)

    def __init__(self, client):
        self.client = client

    def __call__(self, x, part=""):
        return _child(self.client.model, part)(x)

    def named_parameters(self):
        return self.client.model.named_parameters()

    def teacher(self, teacher, x, part=""):
        with torch.no_grad():
            return _child(getattr(self.client, teacher.attr), part)(x)

    def teacher_parameters(self, teacher):
        return dict(getattr(self.client, teacher.attr).named_parameters())

    def fixed(self, fixed):
        return getattr(self.client, fixed.attr)
