"""The objectives' :class:`~flcore.training.objective.ModelView` over functional, stacked tensors.

Inside ``vmap`` one client's objective sees its own slice of the stacked parameters and buffers and of
its round-fixed inputs (``extras``), and runs the model through :class:`FunctionalNet`. The inputs an
objective declares (:meth:`Objective.inputs`) are read from each client after its
``begin_local_training`` by :func:`round_inputs` and stacked along the client axis by the engine, in
one flat ``{key: tensor}`` dict:

* a :class:`Teacher` in attribute ``a``: its parameters under ``a.<name>``, its buffers under
  ``a:buffers.<name>`` (``:`` cannot occur in an attribute name, so the two never overlap);
* a :class:`Fixed` tensor under ``a``; a :class:`Fixed` dict under ``a.<name>``.
"""
from __future__ import annotations

from typing import Mapping

import torch

from flcore.vmapped.functional import FunctionalNet, Tensors, part_of
from flcore.training.objective import Fixed, Objective, Teacher


def _buffers_key(teacher: Teacher) -> str:
    return f"{teacher.attr}:buffers."


def round_inputs(objective: Objective, client) -> Tensors:
    """The flat, detached round-fixed inputs ``objective`` reads, from ``client`` as it is now."""
    found: Tensors = {}
    for handle in objective.inputs():
        value = getattr(client, handle.attr)
        if isinstance(handle, Teacher):
            found.update({f"{handle.attr}.{n}": p.detach() for n, p in value.named_parameters()})
            found.update({_buffers_key(handle) + n: b.detach() for n, b in value.named_buffers()})
        elif isinstance(value, Mapping):
            found.update({f"{handle.attr}.{n}": t.detach() for n, t in value.items()})
        else:
            found[handle.attr] = value.detach()
    return found


def _path(*parts: str) -> str:
    return ".".join(p for p in parts if p)


class FunctionalModel:
    """One client's model as a :class:`~flcore.training.objective.ModelView`: ``params`` and ``buffers``
    by the model's names (one client's slice: no client axis inside ``vmap``), ``extras`` as
    :func:`round_inputs` returns them."""

    def __init__(self, net: FunctionalNet, params: Tensors, buffers: Tensors, extras: Tensors):
        self.net, self.params, self.buffers, self.extras = net, params, buffers, extras

    def __call__(self, x: torch.Tensor, part: str = "") -> torch.Tensor:
        if not part:
            return self.net.run(x, self.params, self.buffers)
        prefix = f"{part}."
        return self.net.run(x, part_of(self.params, prefix), part_of(self.buffers, prefix), part=part)

    def named_parameters(self):
        return ((name, self.params[name]) for name in self.net.param_names)

    def teacher(self, teacher: Teacher, x: torch.Tensor, part: str = "") -> torch.Tensor:
        # Names inside the teacher are relative to it; it has the structure of ``teacher.part`` of the model.
        prefix = f"{part}." if part else ""
        params = part_of(self.extras, f"{teacher.attr}.{prefix}")
        buffers = part_of(self.extras, _buffers_key(teacher) + prefix)
        with torch.no_grad():
            return self.net.run(x, params, buffers, part=_path(teacher.part, part), training=False)

    def teacher_parameters(self, teacher: Teacher) -> Mapping[str, torch.Tensor]:
        return part_of(self.extras, f"{teacher.attr}.")

    def fixed(self, fixed: Fixed):
        if fixed.attr in self.extras:
            return self.extras[fixed.attr]
        return part_of(self.extras, f"{fixed.attr}.")
