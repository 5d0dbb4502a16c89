"""A personal layer shared within the clients that agree on it (``--lag_share groups``).

A layer FedLAG keeps personal is one whose updates conflict across the federation; they may still agree
within groups of clients. Under concept shift (each group of clients names the classes through its own
label map) the head's updates point one way inside a group and apart across groups, so keeping the head
personal per client (FedPer) throws away what a group could learn together.

Which clients agree is read from the updates the server already scores. One round's cosine of one pair
is too noisy to act on (on the embedded concept-shift split, same-group pairs average 0.2 with a spread
of 0.2, cross-group pairs 0.0), and with few uploads a round most pairs are never sampled together (at
``-jr 0.2`` with 40 clients, about one pair in two in 20 rounds). So each client's updates of a personal
layer are summed into its *profile*, the layer's whole pull by that client's data over the rounds it
uploaded (no decay: which group a client is in is a property of its data; and a learnt layer's updates
are small, so the noise of the late rounds adds little to the early, large ones). Two clients agree when
their profiles, less the mean profile of all clients (the direction every client pushes the layer, e.g.
as the features sharpen), point the same way; every pair of clients is compared, sampled together or
not. A profile of fewer than :data:`MIN_UPLOADS` updates is mostly noise, and its client stays alone.

Groups change on evidence, as the personal layers do. Each round starts from the last round's groups: a
member whose profile conflicts with the rest of its group on average (mean cosine below ``--lag_xi``)
leaves it, the most conflicting first; then groups merge by average linkage, the two most agreeing first
(ties to the lower client ids), while the mean cosine between them is above ``--lag_group_cosine``.
Between the two thresholds nothing changes, so a group whose members have learnt together holds. A client
not sampled in a round keeps its profile, and so its group. A group is named by its smallest client id.
The result depends on the evidence only, not on the order clients upload in. Measured on the embedded
concept-shift split (``-nc 40 -lr 0.05 -gr 100``, seeds 0 and 1): final 97.8 and 96.8, where groups formed
afresh every round from unit-length updates ended at 92.2 and 89.6 (best 96.3), their groups fragmenting as
noise accumulated.

Pure tensor functions plus :class:`UpdateProfiles`, the accumulated profiles and their state for
checkpoints. Imports only torch, as the rest of ``lag/``.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import torch

# Uploads of a layer before a client's profile counts: measured at -jr 0.2 on the concept-shift split, one
# or two updates merged clients of different groups early, and the heads they shared cost 2-4 points.
MIN_UPLOADS = 3


def add_updates(profiles: torch.Tensor, counts: torch.Tensor, updates: torch.Tensor, ids: Sequence[int]) -> None:
    """Add each update to its client's profile, and count it, in place.

    ``profiles``: (N, d) float64; ``counts``: (N,) int64 updates added so far; ``updates``: (m, d), row i
    of client ``ids[i]``. An update of zero norm carries nothing: it is not counted."""
    has = updates.double().norm(dim=1) > 0
    index = torch.as_tensor(list(ids), dtype=torch.long)
    profiles[index[has]] += updates.double()[has]
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


def leave_conflicting(groups: torch.Tensor, cos: torch.Tensor, seen: torch.Tensor, below: float) -> torch.Tensor:
    """The split step: in each group, while a member's mean cosine with the rest of it (over its seen pairs)
    is below ``below``, the most conflicting member (ties to the higher id) leaves and is alone. Returns the
    new (N,) groups, each named by its smallest client id; a member with no seen pair in its group stays."""
    groups = groups.clone()
    for group in sorted(set(groups.tolist())):
        members = (groups == group).nonzero().flatten().tolist()
        while len(members) > 1:
            index = torch.tensor(members)
            block_seen = seen[index][:, index].double()
            sums, counts = (cos[index][:, index].double() * block_seen).sum(dim=1), block_seen.sum(dim=1)
            means = torch.where(counts > 0, sums / counts.clamp(min=1), torch.full_like(sums, float("inf")))
            worst = len(members) - 1 - int(torch.argmin(means.flip(0)))
            if not float(means[worst]) < below:
                break
            leaving = members.pop(worst)
            groups[leaving] = leaving
            groups[index.new_tensor(members)] = min(members)
    return groups


def agreeing_groups(cos: torch.Tensor, seen: torch.Tensor, above: float, start: torch.Tensor | None = None) -> torch.Tensor:
    """Average-linkage groups of N clients from their pairwise cosines ((N, N); only ``seen`` pairs count).

    From the groups ``start`` (each client alone when None), the pair of groups with the highest mean
    cosine between them (over their seen pairs) merges, ties to the lower client ids, while that mean is
    above ``above``; groups with no seen pair between them never merge. Returns an (N,) int64 tensor: each
    client's group, named by its smallest client id.
    """
    n = cos.shape[0]
    weights = seen.double()
    sums = cos.double() * weights
    labels = torch.arange(n)
    active = torch.ones(n, dtype=torch.bool)
    upper = torch.ones((n, n), dtype=torch.bool).triu(diagonal=1)
    for b, a in enumerate([] if start is None else start.tolist()):
        if a != b:  # b joins the group named a (its smallest id, so a < b)
            for table in (sums, weights):
                table[a, :] += table[b, :]
                table[:, a] += table[:, b]
            active[b] = False
            labels[b] = a
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
    dropped, with its groups, when it returns to shared: memory is clients x the personal layers' size, in
    float64.
    """

    def __init__(self, num_clients: int, above: float, below: float = 0.0):
        self.num_clients = int(num_clients)
        self.above, self.below = float(above), float(below)
        self.profiles: Dict[int, torch.Tensor] = {}  # layer index -> (N, layer size)
        self.counts: Dict[int, torch.Tensor] = {}    # layer index -> (N,) updates in each profile
        self.groups: Dict[int, torch.Tensor] = {}    # layer index -> (N,) the groups as they stand

    def observe(self, layer_updates: Dict[int, torch.Tensor], ids: Sequence[int], personal: Sequence[int]) -> None:
        """One round: ``layer_updates[l]`` holds the (m, size) updates of layer l by the clients ``ids``
        (empty for a round without uploads); only the ``personal`` layers keep profiles. Then every personal
        layer's groups are updated on the evidence (:meth:`groups_of`)."""
        for layer in [l for l in self.profiles if l not in personal]:
            del self.profiles[layer], self.counts[layer]
            self.groups.pop(layer, None)
        for layer in personal:
            updates = layer_updates.get(layer)
            if updates is None:
                continue
            if layer not in self.profiles:
                self.profiles[layer] = torch.zeros((self.num_clients, updates.shape[1]), dtype=torch.float64)
                self.counts[layer] = torch.zeros(self.num_clients, dtype=torch.int64)
            add_updates(self.profiles[layer], self.counts[layer], updates, ids)
        for layer in self.profiles:
            cos, seen = profile_cosines(self.profiles[layer], self.counts[layer] >= MIN_UPLOADS)
            current = self.groups.get(layer)
            if current is not None:
                current = leave_conflicting(current, cos, seen, self.below)
            self.groups[layer] = agreeing_groups(cos, seen, self.above, current)

    def groups_of(self, layer: int) -> torch.Tensor:
        """Every client's group for ``layer`` as it stands (each alone while the layer has no profiles)."""
        return self.groups[layer].clone() if layer in self.groups else torch.arange(self.num_clients)

    def state_dict(self) -> dict:
        return {name: {int(l): t.clone() for l, t in getattr(self, name).items()}
                for name in ("profiles", "counts", "groups")}

    def load_state_dict(self, state: dict) -> None:
        loaded = {}
        for name, dtype in (("profiles", torch.float64), ("counts", torch.int64), ("groups", torch.int64)):
            loaded[name] = {}
            for layer, value in state[name].items():
                if not isinstance(value, torch.Tensor) or value.shape[0] != self.num_clients:
                    raise ValueError(f"lag groups: {name} of {self.num_clients} clients expected for layer {layer}")
                loaded[name][int(layer)] = value.clone().to(dtype)
        self.profiles, self.counts, self.groups = loaded["profiles"], loaded["counts"], loaded["groups"]
