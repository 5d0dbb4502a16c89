"""``--lag_share groups`` on a server: who shares which personal layer, the groups' models, and what each
client receives of them.

Each round the updates of the personal layers join the clients' profiles and every personal layer's
groups are updated (:class:`~.groups.UpdateProfiles`, the rule itself). After aggregation the server forms
each group's model of each personal layer: the average of every member's latest copy (its parameters and
its module's buffers), weighted by the members' training samples, members in ascending id order (so the
sum does not depend on upload order). A member that uploaded this round contributes what it uploaded; one
that did not, the copy it holds, which the server knows (it sent it, or received it). So a large client
that sat the round out is not overwritten by one small uploader's copy, and with every client uploading
this is the average of the group's uploads. A client alone keeps its own copy.

The models are held here until the next round's broadcast, which carries them as part of each member's
payload (:meth:`GroupSharing.payload`); nothing here writes into a client. A round without uploads forms
none, so the broadcast after it leaves every member with what it holds. Members that share every group
receive one object (one copy of the tensors for all of them), and what they receive is kept in
checkpoints until it is delivered. Imports only torch, as the rest of ``lag/``.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .groups import UpdateProfiles, group_members, sample_weighted_average

State = Dict[str, torch.Tensor]


class GroupSharing:
    """The profiles and groups of the personal layers, and the group models members receive next.

    ``num_clients``: the run's clients (ids 0..N-1); ``above`` and ``below``: ``--lag_group_cosine`` and
    ``--lag_xi``; ``prefix``: the clients' shared module path, so payloads name tensors relative to it.
    """

    def __init__(self, num_clients: int, above: float, below: float, prefix: str = ""):
        self.profiles = UpdateProfiles(num_clients, above, below)
        self.prefix = prefix
        self.history: List[torch.Tensor] = []  # per round: (layers, clients), each client's group, -1 if shared
        # What each member receives next: one state per distinct set of groups (names relative to the shared
        # module), and for every client the index of its state (-1: nothing beyond the broadcast).
        self.parts: List[State] = []
        self.receives = torch.full((num_clients,), -1, dtype=torch.int64)

    @property
    def num_clients(self) -> int:
        return self.profiles.num_clients

    def regroup(self, updates: Dict[int, torch.Tensor], ids: Sequence[int], personal: Sequence[int],
                num_layers: int) -> torch.Tensor:
        """One round: ``updates[l]`` holds the (len(ids), size) updates of personal layer l by clients ``ids``
        (empty without uploads). Returns, and records, the groups of every layer: (num_layers, clients),
        each client's group named by its smallest client id, -1 for the shared layers."""
        self.profiles.observe(updates, list(ids), personal)
        groups = torch.full((num_layers, self.num_clients), -1, dtype=torch.int64)
        for layer in personal:
            groups[layer] = self.profiles.groups_of(layer)
        self.history.append(groups)
        return groups

    @torch.no_grad()
    def share(self, personal: Sequence[int], names_of: Callable[[int], Sequence[str]],
              tensors_of: Callable[[int], State], samples: Sequence[int]) -> None:
        """Form the group models of the ``personal`` layers from the last round's groups: ``names_of(l)`` are
        layer l's tensors by full name (parameters and their module's buffers), ``tensors_of(i)`` client i's
        model tensors by full name (read, never written), ``samples[i]`` its training samples.

        Layers are taken in order; where two layers hold the same tensor (a module's buffers, at tensor
        granularity), the later one averages what the earlier one gave each member."""
        groups = self.history[-1]
        given: Dict[int, State] = {}     # client id -> what it receives so far, by full name
        signature: Dict[int, list] = {}  # client id -> the (layer, group) pairs it receives
        for layer in personal:
            names = names_of(layer)
            for group, members in group_members(groups[layer]).items():
                copies = []
                for i in members:  # each member's copy: what an earlier layer gave it, else what it holds
                    earlier = given.get(i, {})
                    copies.append({n: earlier.get(n, t) for n, t in _only(tensors_of(i), names).items()})
                average = sample_weighted_average(copies, [samples[i] for i in members])
                for i in members:
                    given.setdefault(i, {}).update(average)
                    signature.setdefault(i, []).append((layer, group))
        self.clear()
        index_of: Dict[Tuple, int] = {}
        for client in sorted(given):
            key = tuple(signature[client])
            if key not in index_of:
                index_of[key] = len(self.parts)
                self.parts.append(relative_to(self.prefix, given[client]))
            self.receives[client] = index_of[key]

    def clear(self) -> None:
        """Nothing to deliver beyond the broadcast (a round without uploads forms no group model)."""
        self.parts = []
        self.receives = torch.full((self.num_clients,), -1, dtype=torch.int64)

    def payload(self, client_id: int) -> Optional[State]:
        """What ``client_id`` receives beyond the broadcast (its groups' models, by name relative to the shared
        module; the same object for every client of the same groups), or None."""
        if not 0 <= client_id < self.num_clients:
            return None
        index = int(self.receives[client_id])
        return None if index < 0 else self.parts[index]

    def copy_of(self, layer: int, client_id: int, names: Sequence[str]) -> Optional[Tuple[int, State]]:
        """``(group, copy)``: the model of ``layer`` (its tensors ``names``, by full name) that ``client_id``'s
        group holds for the next broadcast, or None while it is alone (or none is held)."""
        part = self.payload(client_id)
        cut = len(self.prefix) + 1 if self.prefix else 0
        if not part or any(n[cut:] not in part for n in names):
            return None
        return int(self.history[-1][layer][client_id]), {n: part[n[cut:]] for n in names}

    def members_of(self, layer: int, group: int) -> List[int]:
        """The clients of ``group`` for ``layer`` in the last round's groups, ids ascending."""
        return (self.history[-1][layer] == group).nonzero().flatten().tolist() if self.history else []


    # ----- state (checkpoints) and results ----------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"profiles": self.profiles.state_dict(), "history": list(self.history),
                "parts": [dict(part) for part in self.parts], "receives": self.receives.clone()}

    def load_state_dict(self, state: dict) -> None:
        """Load :meth:`state_dict`'s output. One saved before group models were held here (when they were
        written into the members at once) has none to deliver: its members hold them already."""
        self.profiles.load_state_dict(state["profiles"])
        self.history = [g.clone() for g in state["history"]]
        self.clear()
        if "parts" in state:
            receives = state["receives"]
            if not isinstance(receives, torch.Tensor) or receives.shape != (self.num_clients,):
                raise ValueError(f"lag groups: what each of {self.num_clients} clients receives expected")
            self.parts = [{name: t.clone() for name, t in part.items()} for part in state["parts"]]
            if receives.numel() and int(receives.max()) >= len(self.parts):
                raise ValueError("lag groups: a client receives a group model that is not saved")
            self.receives = receives.clone().to(torch.int64)

    def result_rows(self, unscored_before: int, num_layers: int) -> torch.Tensor:
        """``lag_groups[r, l, c]``: client c's group for layer l after round r (its smallest client id), -1
        where layer l was shared; ``unscored_before`` rounds that came before the layers were known."""
        rows = [torch.full((num_layers, self.num_clients), -1, dtype=torch.int64)] * unscored_before
        rows += self.history
        return torch.stack(rows) if rows else torch.zeros((0, num_layers, self.num_clients), dtype=torch.int64)


def relative_to(prefix: str, tensors: State) -> State:
    """``tensors`` by full name, renamed relative to the module at ``prefix`` (the clients' shared module)."""
    cut = len(prefix) + 1 if prefix else 0
    return {name[cut:]: tensor for name, tensor in tensors.items()}


def _only(tensors: State, names: Sequence[str]) -> State:
    return {name: tensors[name] for name in names}
