"""A personal layer shared within the clients that agree on it (``--lag_share groups``).

A layer FedLAG keeps personal is one whose updates conflict across the federation; they may still agree
within groups of clients. Under concept shift (each group of clients names the classes through its own
label map) the head's updates point one way inside a group and apart across groups, so keeping the head
personal per client (FedPer) throws away what a group could learn together.

Which clients agree is read from the updates the server already scores. One round's cosine of one pair
is too noisy to act on (on the embedded concept-shift split, same-group pairs average 0.2 with a spread
of 0.2, cross-group pairs 0.0), and with few uploads a round most pairs are never sampled together (at
``-jr 0.2`` with 40 clients, about one pair in two in 20 rounds). So each client's updates of a personal
layer are accumulated into its *profile*, the sum of its unit-length updates over every round it uploaded
(no decay: which group a client is in is a property of its data, and once a group has learnt together
its updates carry little of it). Two clients agree when their profiles, less the mean profile of all
clients (the direction every client pushes the layer, e.g. as the features sharpen), point the same way;
every pair of clients is compared, sampled together or not. A profile of fewer than
:data:`MIN_UPLOADS` updates is mostly noise, and its client stays alone.

Groups are formed afresh every round by average linkage on those cosines, from each client alone: the
two most agreeing groups merge (ties to the lower client ids) while the mean cosine between them is above
``--lag_group_cosine``. A client not sampled in a round keeps its profile, and so its group. A group is
named by its smallest client id. The result depends on the evidence only, not on the order clients
upload in. Measured on the embedded concept-shift split (``benchmarks/lag_groups.py``), the groups match
the true ones (adjusted Rand index 1) from round 6 with every client uploading and by round 42 at
``-jr 0.2``, where one round's pair cosines, accumulated per pair, never passed 0.3.

Pure tensor functions plus :class:`UpdateProfiles`, the accumulated profiles and their state for
checkpoints. Imports only torch, as the rest of ``lag/``.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import torch

# Uploads of a layer before a client's profile counts: measured at -jr 0.2 on the concept-shift split, one
# or two updates merged clients of different groups early, and the heads they shared cost 2-4 points.
MIN_UPLOADS = 3


def add_unit_updates(profiles: torch.Tensor, counts: torch.Tensor, updates: torch.Tensor,
                     ids: Sequence[int]) -> None:
    """Add each update, scaled to unit length, to its client's profile, and count it, in place.

    ``profiles``: (N, d) float64; ``counts``: (N,) int64 updates added so far; ``updates``: (m, d), row i
    of client ``ids[i]``. An update of zero norm has no direction: it adds and counts nothing."""
    norms = updates.double().norm(dim=1, keepdim=True)
    has = norms.squeeze(1) > 0
    index = torch.as_tensor(list(ids), dtype=torch.long)
    profiles[index[has]] += updates.double()[has] / norms[has]
    counts[index[has]] += 1


def profile_cosines(profiles: torch.Tensor, counted: torch.Tensor) -> tuple:
    """``(cos, seen)``: the (N, N) cosines of the ``counted`` clients' profiles less their mean profile,
    through one Gram matrix, and which pairs are two distinct counted clients (a zero row counts as none)."""
    centred = torch.where(counted.unsqueeze(1), profiles - profiles[counted].mean(dim=0), torch.zeros_like(profiles)) \
        if bool(counted.any()) else profiles
    gram = centred @ centred.T
    norms = gram.diagonal().clamp(min=0).sqrt()
    has = counted & (norms > 0)
    safe = torch.where(has, norms, torch.ones_like(norms))
    seen = has.unsqueeze(0) & has.unsqueeze(1)
    seen.fill_diagonal_(False)
    return (gram / safe.unsqueeze(0) / safe.unsqueeze(1)).clamp(-1.0, 1.0), seen


def agreeing_groups(cos: torch.Tensor, seen: torch.Tensor, above: float) -> torch.Tensor:
    """Average-linkage groups of N clients from their pairwise cosines ((N, N); only ``seen`` pairs count).

    From each client alone, the pair of groups with the highest mean cosine between them (over their seen
    pairs) merges, ties to the lower client ids, while that mean is above ``above``; groups with no seen
    pair between them never merge. Returns an (N,) int64 tensor: each client's group, named by its
    smallest client id.
    """
    n = cos.shape[0]
    weights = seen.double()
    sums = cos.double() * weights
    labels = torch.arange(n)
    active = torch.ones(n, dtype=torch.bool)
    upper = torch.ones((n, n), dtype=torch.bool).triu(diagonal=1)
    while True:
        candidates = upper & active.unsqueeze(0) & active.unsqueeze(1) & (weights > 0)
        if not bool(candidates.any()):
            break
        means = torch.full((n, n), float("-inf"), dtype=torch.float64)
        means[candidates] = sums[candidates] / weights[candidates]
        best = int(torch.argmax(means))  # the first maximum in row-major order: ties to the lower ids
        a, b = divmod(best, n)
        if not float(means[a, b]) > above:
            break
        # b's group joins a's (a < b, so a stays the smallest id of the merged group).
        for table in (sums, weights):
            table[a, :] += table[b, :]
            table[:, a] += table[:, b]
        active[b] = False
        labels[labels == b] = a
    return labels


def group_members(labels: torch.Tensor) -> Dict[int, List[int]]:
    """``{group: [client ids]}`` of the groups with at least two clients, ids ascending."""
    members: Dict[int, List[int]] = {}
    for client, group in enumerate(labels.tolist()):
        members.setdefault(group, []).append(client)
    return {group: ids for group, ids in members.items() if len(ids) > 1}


def sample_weighted_average(states: Sequence[Dict[str, torch.Tensor]], samples: Sequence[int]) -> Dict[str, torch.Tensor]:
    """``sum_i n_i / sum(n) * states[i][name]`` for every floating-point tensor, accumulated in the given
    order; integer tensors (BatchNorm's batch counters) keep the largest, as the server's FedAvg does."""
    total = float(sum(samples))
    weights = [n / total if total > 0 else 1.0 / len(samples) for n in samples]
    out: Dict[str, torch.Tensor] = {}
    for name, first in states[0].items():
        if first.is_floating_point():
            acc = torch.zeros_like(first)
            for state, weight in zip(states, weights):
                acc.add_(state[name].detach(), alpha=weight)
            out[name] = acc
        else:
            out[name] = torch.stack([state[name].detach() for state in states]).amax(dim=0)
    return out


class UpdateProfiles:
    """Every client's profile of each personal layer, and the groups they give.

    A layer's profiles start when it becomes personal (with the round's updates that made it so) and are
    dropped when it returns to shared: memory is clients x the personal layers' size, in float64.
    """

    def __init__(self, num_clients: int, above: float):
        self.num_clients = int(num_clients)
        self.above = float(above)
        self.profiles: Dict[int, torch.Tensor] = {}  # layer index -> (N, layer size)
        self.counts: Dict[int, torch.Tensor] = {}    # layer index -> (N,) updates in each profile

    def observe(self, layer_updates: Dict[int, torch.Tensor], ids: Sequence[int], personal: Sequence[int]) -> None:
        """One round: ``layer_updates[l]`` holds the (m, size) updates of layer l by the clients ``ids``
        (empty for a round without uploads); only the ``personal`` layers keep profiles."""
        for layer in [l for l in self.profiles if l not in personal]:
            del self.profiles[layer], self.counts[layer]
        for layer in personal:
            updates = layer_updates.get(layer)
            if updates is None:
                continue
            if layer not in self.profiles:
                self.profiles[layer] = torch.zeros((self.num_clients, updates.shape[1]), dtype=torch.float64)
                self.counts[layer] = torch.zeros(self.num_clients, dtype=torch.int64)
            add_unit_updates(self.profiles[layer], self.counts[layer], updates, ids)

    def groups(self, layer: int) -> torch.Tensor:
        """Every client's group for ``layer`` (each alone while the layer has no profiles)."""
        if layer not in self.profiles:
            return torch.arange(self.num_clients)
        cos, seen = profile_cosines(self.profiles[layer], self.counts[layer] >= MIN_UPLOADS)
        return agreeing_groups(cos, seen, self.above)

    def state_dict(self) -> dict:
        return {"profiles": {int(l): p.clone() for l, p in self.profiles.items()},
                "counts": {int(l): c.clone() for l, c in self.counts.items()}}

    def load_state_dict(self, state: dict) -> None:
        profiles, counts = {}, {}
        for layer, value in state["profiles"].items():
            count = state["counts"].get(layer)
            if (not isinstance(value, torch.Tensor) or value.dim() != 2 or value.shape[0] != self.num_clients
                    or not isinstance(count, torch.Tensor) or count.shape != (self.num_clients,)):
                raise ValueError(f"lag groups: profiles of {self.num_clients} clients expected for layer {layer}")
            profiles[int(layer)], counts[int(layer)] = value.clone().double(), count.clone().long()
        self.profiles, self.counts = profiles, counts
