"""Client state along a client axis: models stacked for the batched steps and written back in place,
and one split of every client's data in one tensor on the device."""
from __future__ import annotations

from typing import Dict, List, Mapping, Sequence, Tuple

import torch
from torch import nn

Tensors = Dict[str, torch.Tensor]


def stack_dicts(dicts: Sequence[Mapping[str, torch.Tensor]]) -> Tensors:
    """``{name: (clients, ...) tensor}`` from one dict per client (all with the same names)."""
    if not dicts or not dicts[0]:
        return {}
    with torch.no_grad():
        return {name: torch.stack([d[name].detach() for d in dicts]) for name in dicts[0]}


class StackedModels:
    """The parameters and buffers of same-shaped models, one ``(clients, ...)`` tensor per name."""

    def __init__(self, models: Sequence[nn.Module]):
        self.param_names: List[str] = [name for name, _ in models[0].named_parameters()]
        self.buffer_names: List[str] = [name for name, _ in models[0].named_buffers()]
        self.params = stack_dicts([dict(m.named_parameters()) for m in models])
        self.buffers = stack_dicts([dict(m.named_buffers()) for m in models])

    @torch.no_grad()
    def write_back(self, models: Sequence[nn.Module]) -> None:
        """Copy row ``i`` into ``models[i]``'s own tensors, in place (live references stay valid)."""
        for i, model in enumerate(models):
            for name, param in model.named_parameters():
                param.copy_(self.params[name][i])
            for name, buffer in model.named_buffers():
                buffer.copy_(self.buffers[name][i])

    def set_grads(self, models: Sequence[nn.Module], grads: Tensors, rows: Sequence[int]) -> None:
        """``.grad`` of the named parameters of ``models[i]`` for ``i`` in ``rows``: what a sequential run
        leaves there (the last minibatch's gradient), read by FedLAG's ``last_batch`` signal."""
        for i in rows:
            for name, grad in grads.items():
                models[i].get_parameter(name).grad = grad[i].clone()


def _channels_last(x: torch.Tensor) -> bool:
    return x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()


class StackedData:
    """One split (``train_data`` or ``test_data``) of every client concatenated on the device once, with
    each client's first row.

    Rebuilt only when a client's data tensors are not the ones it was built from (or a client is new),
    so across rounds the data is gathered once per engine, not once per round. Image codes stay codes
    when every client's palette is the same (:meth:`inputs` decodes the rows a step reads); otherwise
    each client's rows are decoded once, here.
    """

    def __init__(self, split: str = "train_data"):
        self.split = split
        self.x = self.y = self.palette = None
        self._rows: Dict[int, int] = {}
        self._sources: Dict[int, Tuple] = {}  # client id -> the (x, y, palette) it was built from

    def inputs(self, index: torch.Tensor) -> torch.Tensor:
        """The rows ``index`` of the stacked inputs, as the model takes them."""
        stored = self.x[index]
        return stored if self.palette is None else self.palette[stored.long()]

    def _current(self, client) -> bool:
        source, data = self._sources.get(client.id), getattr(client, self.split)
        return source is not None and all(a is b for a, b in zip(source, (data.x, data.y, data.palette)))

    def offsets(self, clients: Sequence, everyone: Sequence = ()) -> List[int]:
        """The first row of each of ``clients``; (re)built over ``everyone`` and ``clients`` when needed."""
        if not all(self._current(c) for c in clients):
            members = {c.id: c for c in everyone}
            members.update({c.id: c for c in clients})
            self._build(list(members.values()))
        return [self._rows[c.id] for c in clients]

    def _build(self, clients: Sequence) -> None:
        self.x = self.y = self.palette = None  # free the old copy before the new one is made
        splits = [getattr(c, self.split) for c in clients]
        palettes = [data.palette for data in splits]
        common = palettes[0]
        if common is not None and not all(p is not None and torch.equal(p, common) for p in palettes[1:]):
            common = None
        xs = [data.x if common is not None else data.inputs(data.x) for data in splits]
        ys = [data.y for data in splits]
        x = torch.cat(xs)
        self.x = x.contiguous(memory_format=torch.channels_last) if _channels_last(xs[0]) else x
        self.y = torch.cat(ys)
        self.palette = common
        self._rows, start = {}, 0
        for client, part in zip(clients, ys):
            self._rows[client.id] = start
            start += int(part.shape[0])
        self._sources = {c.id: (data.x, data.y, data.palette) for c, data in zip(clients, splits)}
