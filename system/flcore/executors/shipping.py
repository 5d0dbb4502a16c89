"""What travels to a worker that trains a client away from the server, and what comes back.

A parked client (:mod:`flcore.clients.parking`) is mostly references: to tensors many clients share (the
round's broadcast, the initial model, SCAFFOLD's server control) and to the templates its working modules
come from. Pickled one client at a time, each would carry its own copy of all of them: the whole model,
once per client. Here they travel once: a :class:`SharedTable` lists the round's shared tensors and the
templates, the executor sends that once (the Ray executor: the tensors to each worker once a round, the
templates once a run), and each client travels as a pickle of what is its own, where every shared
tensor, template and optimiser stand-in is a reference into the table. The worker reads the client
against its copy of the table, trains it, parks it (which keeps the tensors training left unchanged as
references) and sends back its state and update the same way, so what it still shares costs nothing on
the way back.

Values never change on the way, so results are those of training in the server's process
(``tests/execution/test_executors.py`` checks every algorithm).
"""
from __future__ import annotations

import io
import pickle
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from flcore.aggregation import named_tensors
from flcore.clients.clientbase import Client
from flcore.clients.parked_modules import ModuleTemplate, tensor_key
from flcore.exchange import ClientUpdate

_DATA_ATTRS = ("train_data", "test_data", "val_data")


class SharedTable:
    """Tensors and module templates both sides hold, so that a pickle names them instead of carrying them.

    ``tensors``: shared by the clients of one round (nobody writes them). ``templates``: the structures of
    their modules; a template's optimiser stand-ins are named through it."""

    def __init__(self, tensors: Sequence[torch.Tensor], templates: Sequence[ModuleTemplate]):
        self.tensors, self.templates = list(tensors), list(templates)
        # By view, not identity: a client may hold a view of a shared tensor of its own.
        self._tensor_at = {tensor_key(t): i for i, t in enumerate(self.tensors)}
        self._template_at = {id(t): i for i, t in enumerate(self.templates)}
        self._prototype_tensors: Dict[int, Dict[str, torch.Tensor]] = {}  # template index -> its tensors

    @classmethod
    def of_round(cls, clients: Iterable[Client], templates: Optional[List[ModuleTemplate]] = None) -> "SharedTable":
        """The table for ``clients``, each :meth:`~flcore.clients.parking.ParkingClient.detached` first.
        Their templates not yet in ``templates`` (the run's list, which a worker keeps a copy of) are
        appended to it."""
        templates = [] if templates is None else templates
        known = {id(t) for t in templates}
        shared: Dict[tuple, torch.Tensor] = {}
        for client in clients:
            found, tensors = client.shared_references()
            for template in found:
                if id(template) not in known:
                    known.add(id(template))
                    templates.append(template)
            for tensor in tensors:
                shared.setdefault(tensor_key(tensor), tensor)
        return cls(list(shared.values()), templates)

    def _reference(self, obj) -> Optional[tuple]:
        if isinstance(obj, torch.Tensor):
            at = self._tensor_at.get(tensor_key(obj))
            if at is not None:
                return ("tensor", at)
            for index, template in enumerate(self.templates):
                owner = template.owner(obj)
                if owner is not None:
                    return ("stand_in", index, *owner)
        elif isinstance(obj, ModuleTemplate):
            return ("template", self._template_at[id(obj)])
        return None

    def _resolve(self, reference: tuple):
        kind, index, *rest = reference
        if kind == "tensor":
            return self.tensors[index]
        template = self.templates[index]
        if kind == "template":
            return template
        slot, name = rest  # a stand-in the copy of the template may not have made yet
        if index not in self._prototype_tensors:
            self._prototype_tensors[index] = named_tensors(template.prototype)
        return template.stand_in(slot, name, self._prototype_tensors[index][name])

    def dumps(self, value) -> bytes:
        """``value`` pickled, with what the table holds named, not copied."""
        buffer = io.BytesIO()
        pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        pickler.persistent_id = self._reference
        pickler.dump(value)
        return buffer.getvalue()

    def loads(self, data: bytes):
        """:meth:`dumps`'s value, what it named taken from this table."""
        unpickler = pickle.Unpickler(io.BytesIO(data))
        unpickler.persistent_load = self._resolve
        return unpickler.load()


def ship(clients: Sequence[Client], templates: Optional[List[ModuleTemplate]] = None
         ) -> Tuple[SharedTable, List[bytes]]:
    """The round's table and each client's pickle (without its data, which workers read themselves)."""
    detached = [client.detached() for client in clients]
    for copy_ in detached:
        for name in _DATA_ATTRS:
            setattr(copy_, name, None)
    table = SharedTable.of_round(detached, templates)
    return table, [table.dumps(copy_) for copy_ in detached]


def train_shipped(client: Client, keep_gradients: bool) -> Tuple[dict, ClientUpdate]:
    """Train ``client`` (read from a table away from the server) and return its new state and its update,
    parked: tensors that training left as they were stay the table's, so they travel back as names."""
    client.check_out()
    update = client.train()
    update = client.release(update if keep_gradients else update.without_gradients())
    return client.get_state(), update
