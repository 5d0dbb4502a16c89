"""``--lag_share check`` on a server: the copies of each personal layer a client may take, its checks, and
what it receives of them.

After aggregation the server holds, for every personal layer, everyone's copy (its average of the
round's uploads, which the base server computes anyway) and each group's copy (:class:`~.sharing.GroupSharing`).
Before the next round's clients train, each selected client checks them against its own copy on its
check data (:mod:`.check`), and from then on receives the copy it took as part of its payload; a client
that keeps its own receives nothing for that layer. A client not selected keeps the choice it made last,
with the copies of the round. Nothing here writes into a client, nor builds its model: one model of the
same architecture runs on each client's tensors through ``functional_call``. Imports only torch, as the rest of ``lag/``.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from .check import ALL, GROUP, CopyChoice, copy_losses
from .sharing import relative_to

State = Dict[str, torch.Tensor]


class CheckedCopies:
    """Everyone's copies of the personal layers, the clients' choices among own, group and all, and the
    payloads they give. ``prefix``: the clients' shared module path (payloads name tensors relative to it);
    ``data``: ``"held_out"`` (each client's validation split) or ``"train"`` (its training data)."""

    def __init__(self, num_clients: int, decay: float, margin: float, data: str, prefix: str = ""):
        self.choices = CopyChoice(num_clients, decay, margin)
        self.data = data
        self.prefix = prefix
        self.everyone: State = {}                 # full name -> the server's average, held until the next one
        self._payloads: Dict[Tuple, State] = {}  # what each distinct set of choices receives, this round

    def hold_everyones(self, personal: Sequence[int], names_of: Callable[[int], Sequence[str]],
                       global_tensors: State) -> None:
        """After aggregation: keep a copy of the server's average of every personal layer."""
        self.everyone = {n: global_tensors[n].detach().clone() for layer in personal for n in names_of(layer)}
        self._payloads = {}

    def check(self, clients: Iterable, personal: Sequence[int], names_of: Callable[[int], Sequence[str]],
              group_of: Callable[[int, int], Optional[Tuple[int, State]]],
              members_of: Callable[[int, int], Sequence[int]], tensors_of: Callable, template) -> None:
        """Each of ``clients`` compares, layer by layer, the copies it could take with its own:
        ``group_of(layer, client_id)`` is its group's ``(group, copy)`` by full name, or None when alone;
        ``members_of(layer, group)`` the group's clients, whose evidence it reads with its own. The clients'
        models are not built: ``template`` (a model of the same architecture) runs on each client's tensors,
        ``tensors_of(client)`` by full name (read, never written), through ``functional_call``."""
        if not self.everyone:
            return  # nothing aggregated yet: every client has only its own copy
        everyones = {layer: {n: self.everyone[n] for n in names_of(layer)} for layer in personal}
        for client in clients:
            data = client.val_data if self.data == "held_out" else client.train_data
            if data is None or len(data) == 0:
                continue
            held = tensors_of(client)
            for layer in personal:
                group = group_of(layer, client.id)
                copies = [held, None if group is None else {**held, **group[1]}, {**held, **everyones[layer]}]
                pool = () if group is None else members_of(layer, group[0])
                self.choices.observe(layer, client.id, copy_losses(template, data.eval_batches(), copies), pool)

    def payload(self, client_id: int, personal: Sequence[int], names_of: Callable[[int], Sequence[str]],
                group_of: Callable[[int, int], Optional[Tuple[int, State]]]) -> Optional[State]:
        """What ``client_id`` receives of the personal layers: each layer's copy it took, by name relative to
        the shared module (one object for every client of the same choices), or None: its own throughout."""
        if not self.everyone:
            return None
        key: List[Tuple] = []
        sources: List[State] = []  # the copy each entry of the key names
        for layer in personal:
            copy = self.choices.of(layer, client_id)
            group = group_of(layer, client_id) if copy == GROUP else None
            if copy == ALL:
                key.append((layer, ALL))
                sources.append(self.everyone)
            elif group is not None:
                key.append((layer, GROUP, group[0]))
                sources.append(group[1])
        if not key:
            return None
        key = tuple(key)
        if key not in self._payloads:
            given = {n: source[n] for (layer, *_), source in zip(key, sources) for n in names_of(layer)}
            self._payloads[key] = relative_to(self.prefix, given)
        return self._payloads[key]

    def state_dict(self) -> dict:
        return {"choices": self.choices.state_dict(), "everyone": dict(self.everyone)}

    def load_state_dict(self, state: dict) -> None:
        self.choices.load_state_dict(state["choices"])
        self.everyone = {n: t.clone() for n, t in state["everyone"].items()}
        self._payloads = {}
