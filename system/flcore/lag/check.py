"""Which copy of a personal layer each client takes: its own, its group's or everyone's (``--lag_share check``).

Keeping a conflicting layer personal pays where a client's data asks for its own copy (label skew: a
head fitted to its one or two classes), sharing it within a group pays where clients form groups (concept
shift: each group names the classes its own way), and sharing it with all pays where the conflict is
noise the average removes (feature shift with the same labels everywhere). The updates alone cannot tell
these apart: under label skew clients that hold the same classes agree as closely as the members of a
concept group do. So each client decides on its own data, every round it is selected, before it trains:
its model's loss on its check data (held out of training, ``--lag_check_data held_out``) with the layer
replaced by each copy it could take, the others left as it holds them. A copy the client has just
trained on would win on the data it was trained on (on the quickstart's 17-21 training images its own
head has a loss near 0 there); held-out data judges each copy by what it does on data none of them saw.

One round's check on a few images is noisy, so a client changes copy only on evidence, as the
personal layers themselves do, and reads its group's evidence with its own (on the quickstart's split a
client holds out 3-4 images; its group of ten, 40): for every two copies it keeps the decayed mean and spread, over the rounds
it checked both, of the difference of their losses in the same round (a paired gap: every copy's loss
falls as the features learn, and the pairing removes that common trend). It starts on its own copy
(FedPer) and moves to another only when that one's losses lie below its current copy's by more than
``--lag_margin`` standard errors of the paired gap, over at least :data:`MIN_CHECKS` checks. Once it has
moved, the copy it trains from is the one it took, so its own copy starts to resemble it, and it does not
move back on the noise of a near tie. The groups are those :class:`~.groups.UpdateProfiles` finds, the
copies those :class:`~.sharing.GroupSharing` forms; everyone's copy is the server's average of the layer
over the round's uploads.

Pure tensor functions and :class:`CopyChoice`, the decayed gaps, each client's choices and their history
(with their state for checkpoints). Imports only torch, as the rest of ``lag/``.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.func import functional_call

OWN, GROUP, ALL = 0, 1, 2
COPIES = ("own", "group", "all")
# Decayed checks of two copies before one may displace the other (with --lag_decay 0.9: two checks give
# 1.9, three 2.71). A single check has no spread to judge its gap by.
MIN_CHECKS = 2.5

State = Dict[str, torch.Tensor]


@torch.no_grad()
def copy_losses(model: nn.Module, batches: Iterable[Tuple[torch.Tensor, torch.Tensor]],
                copies: Sequence[Optional[State]]) -> List[Optional[float]]:
    """Mean cross-entropy of ``model`` on ``batches`` with each of ``copies`` in place of the tensors it
    names (by full name; the rest as the model holds them), in eval mode; None for a copy that is None.
    The model itself is never written."""
    was_training = model.training
    model.eval()
    sums = [0.0 if copy is not None else None for copy in copies]
    count = 0
    try:
        for x, y in batches:
            count += int(y.shape[0])
            for index, copy in enumerate(copies):
                if copy is not None:
                    logits = functional_call(model, copy, (x,))
                    sums[index] += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
    finally:
        model.train(was_training)
    return [None if s is None else s / max(count, 1) for s in sums]


def lead_over(gap_sums: torch.Tensor, gap_squares: torch.Tensor, weights: torch.Tensor, challenger: int,
              current: int) -> float:
    """Standard errors by which ``challenger``'s losses lie below ``current``'s, pair for pair: the decayed
    mean of ``loss(current) - loss(challenger)`` over its standard error; 0 below :data:`MIN_CHECKS`
    checks, infinite for a lead without spread. Tables (3, 3), entry [a, b] for ``loss(a) - loss(b)``."""
    weight = float(weights[challenger, current])
    if weight < MIN_CHECKS:
        return 0.0
    mean = -float(gap_sums[challenger, current]) / weight
    variance = max(float(gap_squares[challenger, current]) / weight - mean * mean, 0.0)
    if variance <= 0.0:
        return float("inf") if mean > 0 else 0.0
    return mean / (variance / weight) ** 0.5


class CopyChoice:
    """Every client's choice of copy for each personal layer, from the paired gaps of its checks.

    ``num_clients``: ids 0..N-1; ``decay``: the weight the evidence so far keeps at each check
    (``--lag_decay``); ``margin``: standard errors a copy must lead the current one by (``--lag_margin``).
    A layer's evidence starts when it becomes personal and is dropped when it returns to shared (its
    copies then are everyone's again).
    """

    def __init__(self, num_clients: int, decay: float, margin: float):
        self.num_clients = int(num_clients)
        self.decay, self.margin = float(decay), float(margin)
        # layer -> (N, 3, 3): decayed sums of loss(a) - loss(b), of its square, and decayed counts
        self.gap_sums: Dict[int, torch.Tensor] = {}
        self.gap_squares: Dict[int, torch.Tensor] = {}
        self.weights: Dict[int, torch.Tensor] = {}
        self.choice: Dict[int, torch.Tensor] = {}    # layer -> (N,) the copy each client takes now
        self.history: List[torch.Tensor] = []        # per round: (layers, N) each client's copy, -1 if shared

    def keep_layers(self, personal: Sequence[int]) -> None:
        """Forget the layers no longer personal; start the new ones with every client on its own copy."""
        for layer in [l for l in self.choice if l not in personal]:
            del self.gap_sums[layer], self.gap_squares[layer], self.weights[layer], self.choice[layer]
        shape = (self.num_clients, len(COPIES), len(COPIES))
        for layer in personal:
            if layer not in self.choice:
                self.gap_sums[layer] = torch.zeros(shape, dtype=torch.float64)
                self.gap_squares[layer] = torch.zeros(shape, dtype=torch.float64)
                self.weights[layer] = torch.zeros(shape, dtype=torch.float64)
                self.choice[layer] = torch.full((self.num_clients,), OWN, dtype=torch.int64)

    def observe(self, layer: int, client_id: int, losses: Sequence[Optional[float]], pool: Sequence[int] = ()) -> int:
        """One check of one client: ``losses[c]`` of each copy (None where it had none to compare). Returns
        the copy it takes from now on, judged on its own evidence and that of the clients in ``pool`` (the
        other members of its group for this layer)."""
        if losses[OWN] is None:
            raise ValueError("a check needs the client's own copy")
        loss = torch.tensor([float("nan") if v is None else float(v) for v in losses], dtype=torch.float64)
        sums, squares, weights = (t[layer][client_id] for t in (self.gap_sums, self.gap_squares, self.weights))
        for table in (sums, squares, weights):  # all the evidence so far ages at each check
            table.mul_(self.decay)
        gaps = loss.unsqueeze(1) - loss.unsqueeze(0)
        both = ~torch.isnan(gaps)
        sums[both] += gaps[both]
        squares[both] += gaps[both] ** 2
        weights[both] += 1.0
        members = sorted({client_id, *pool})
        sums, squares, weights = (t[layer][members].sum(dim=0) for t in (self.gap_sums, self.gap_squares, self.weights))
        current = int(self.choice[layer][client_id])
        leads = [(lead_over(sums, squares, weights, c, current), -c) for c in range(len(COPIES)) if c != current]
        best, negated = max(leads)
        if best > self.margin:  # the largest lead, ties to the earlier copy
            self.choice[layer][client_id] = -negated
        return int(self.choice[layer][client_id])

    def of(self, layer: int, client_id: int) -> int:
        """The copy ``client_id`` takes of ``layer`` (own where the layer has no evidence)."""
        choice = self.choice.get(layer)
        return OWN if choice is None else int(choice[client_id])

    def end_round(self, num_layers: int) -> torch.Tensor:
        """Record the round's choices: (num_layers, N), -1 for the shared layers."""
        row = torch.full((num_layers, self.num_clients), -1, dtype=torch.int64)
        for layer, choice in self.choice.items():
            row[layer] = choice
        self.history.append(row)
        return row

    def result_rows(self, unscored_before: int, num_layers: int) -> torch.Tensor:
        """``lag_copies[r, l, c]``: the copy (0 own, 1 group, 2 all) client c took of layer l after round r,
        -1 where layer l was shared; ``unscored_before`` rounds came before the layers were known."""
        rows = [torch.full((num_layers, self.num_clients), -1, dtype=torch.int64)] * unscored_before
        rows += self.history
        return torch.stack(rows) if rows else torch.zeros((0, num_layers, self.num_clients), dtype=torch.int64)

    _TABLES = ("gap_sums", "gap_squares", "weights", "choice")

    def state_dict(self) -> dict:
        state = {name: {int(l): t.clone() for l, t in getattr(self, name).items()} for name in self._TABLES}
        state["history"] = [row.clone() for row in self.history]
        return state

    def load_state_dict(self, state: Mapping) -> None:
        pairs = (self.num_clients, len(COPIES), len(COPIES))
        shapes = {"gap_sums": pairs, "gap_squares": pairs, "weights": pairs, "choice": (self.num_clients,)}
        loaded = {}
        for name, shape in shapes.items():
            loaded[name] = {}
            for layer, value in state[name].items():
                if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
                    raise ValueError(f"lag check: {name} of layer {layer} must have shape {shape}")
                loaded[name][int(layer)] = value.clone()
        for name in self._TABLES:
            setattr(self, name, loaded[name])
        self.history = [row.clone() for row in state["history"]]
