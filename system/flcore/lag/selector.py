"""FedLAG's layer choice as one plain object: the conflict evidence gathered round by round, the rule
that turns it into a set of personal layers, the history of both, and their state for checkpoints.

Three rules (``--lag_schedule``):

* ``smoothed`` (the default, chosen by measurement: ``benchmarks/fedlag_stability.py``). Each layer's
  conflict *rate* is the number of conflicting pairs over the number of scored pairs, both summed over
  the rounds with a decay ``--lag_decay`` per scored round, so a round with 6 pairs (4 uploads) weighs
  what it knows and no more, and a round with no pair changes nothing. The personal set changes with
  hysteresis: it fills up to K with the layers of highest positive rate, and an incumbent gives way only
  to a layer whose rate beats it by more than ``--lag_margin``. A layer that returns from personal to
  shared has every client's copy replaced by one average, which is what made FedLAG lose what it had
  learned; the rule makes that rare and deliberate.
* ``every_round``: the paper's Algorithm 1, the top-K of each round's own counts.
* ``warmup``: the authors' code, counts summed over the first W scored rounds, then frozen.

In every rule a layer with no conflict at all is never chosen (with no evidence, nothing new is
personalised), and a round with fewer than two uploads is recorded but changes nothing.

The knobs themselves, and their ``--lag_*`` flags, are :class:`~.settings.LagSettings`. Imports only
torch, so ``lag/`` can be copied into a PFLlib checkout unchanged.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .conflict import Layer, top_k_layers
from .settings import LagError, LagSettings


# ----- the rules, as pure functions ----------------------------------------------------------------------
def top_k_positive(scores: torch.Tensor, k: int) -> Tuple[int, ...]:
    """Indices of the ``k`` highest positive scores, ties to the earlier layer; fewer if fewer are positive."""
    return tuple(i for i in top_k_layers(scores, k) if float(scores[i]) > 0)


def conflict_rates(conflicts: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """Conflicting pairs / scored pairs per layer (float64), 0 where no pair was scored."""
    conflicts, pairs = conflicts.double(), pairs.double()
    return torch.where(pairs > 0, conflicts / pairs.clamp(min=1e-300), torch.zeros_like(pairs))


def hysteresis_choice(rates: torch.Tensor, current: Sequence[int], k: int, margin: float) -> Tuple[int, ...]:
    """The personal set after one update of the rates.

    Fill free places with the layers of highest positive rate; then a challenger replaces the weakest
    incumbent only when its rate is higher by more than ``margin``. Ties rank the earlier layer first,
    so the result depends on the rates alone (not on the order clients uploaded in).
    """
    if k <= 0:
        return ()
    rank = lambda i: (-float(rates[i]), i)  # noqa: E731 - higher rate first, then the earlier layer
    chosen = [i for i in current if i < len(rates)][:max(k, 0)]
    challengers = sorted((i for i in range(len(rates)) if i not in chosen and float(rates[i]) > 0), key=rank)
    for challenger in challengers:
        if len(chosen) < k:
            chosen.append(challenger)
            continue
        weakest = max(chosen, key=rank)
        if float(rates[challenger]) > float(rates[weakest]) + margin:
            chosen[chosen.index(weakest)] = challenger
        else:
            break  # challengers come in falling rate: none after this one can do better
    return tuple(sorted(chosen))


# ----- the object ------------------------------------------------------------------------------------------
class LayerSelector:
    """The candidate layers, the personal set, the accumulated evidence and the per-round history."""

    def __init__(self, settings: LagSettings, layers: Sequence[Layer], method: str = "the base method",
                 own_personal: Sequence[str] = ()):
        """``layers``: the candidates, i.e. what ``method`` shares. ``own_personal``: the layers ``method``
        already keeps personal by design (FedRep's head), at the same granularity.

        K is the size of the personal part: ``method``'s own layers count towards it, so only
        ``K - len(own_personal)`` shared layers are ever added (FedRep+LAG with K = 1 is FedRep). Measured:
        an extra personal base layer is trained only when its client is sampled, and cost FedROD and
        FedAS 0.2-1.8 points at 20% participation. A K that would keep every shared layer personal is
        refused: that is training each client alone (Local), not FedLAG."""
        self.notes: List[str] = []   # things the user should hear about, printed by the caller
        if not layers:
            raise LagError(f"{method} shares no parameters, so there is nothing to personalise")
        self.settings = settings
        self.own_personal: Tuple[str, ...] = tuple(own_personal)
        if self.extra >= len(layers):
            own = (f" on top of the {len(self.own_personal)} it keeps personal itself"
                   if self.own_personal else "")
            raise LagError(f"--lag_top_k {settings.top_k} would keep every one of the {len(layers)} layers "
                           f"{method} shares personal{own} ({', '.join(layer.name for layer in layers)}), which "
                           f"is training each client alone (Local); use --lag_top_k below "
                           f"{len(layers) + len(self.own_personal)}"
                           + ("" if settings.granularity == "tensor" else " or --lag_granularity tensor"))
        if self.own_personal and settings.top_k > 0 and self.extra == 0:
            self.notes.append(f"{method} already keeps {len(self.own_personal)} layer(s) personal "
                              f"({', '.join(self.own_personal)}), which --lag_top_k {settings.top_k} counts: "
                              f"no shared layer is added, conflicts are still recorded "
                              f"(--lag_top_k {len(self.own_personal) + 1} adds one)")
        self.layers: List[Layer] = list(layers)
        self.personal: Tuple[int, ...] = ()
        width = len(self.layers)
        self.conflicts = torch.zeros(width, dtype=torch.float64)  # decayed (smoothed) or summed (warmup)
        self.pairs = torch.zeros(width, dtype=torch.float64)
        self.scored_rounds = 0
        self.history: Dict[str, list] = {key: [] for key in ("scores", "pairs", "personal", "uploads", "scored")}

    @property
    def extra(self) -> int:
        """How many shared layers may become personal: K less the layers the base method keeps itself."""
        return max(0, self.settings.top_k - len(self.own_personal))

    # ----- one round ----------------------------------------------------------------------------------------
    def observe(self, conflicts: Optional[torch.Tensor], pairs: Optional[torch.Tensor], uploads: int
                ) -> Tuple[int, ...]:
        """Take one round's evidence (None when it could not be scored) and return the personal set.

        ``conflicts[l]`` is GC_xi of layer l, ``pairs[l]`` the number of pairs of non-zero updates it
        was counted over. The choice applies from the next broadcast. Every call adds one history row.
        """
        width = len(self.layers)
        scored = conflicts is not None and pairs is not None and bool((pairs > 0).any())
        if scored:
            self._update(conflicts.double(), pairs.double())
        mask = torch.zeros(width, dtype=torch.bool)
        mask[list(self.personal)] = True
        self.history["scores"].append(conflicts.to(torch.int64) if scored else torch.zeros(width, dtype=torch.int64))
        self.history["pairs"].append(pairs.to(torch.int64) if scored else torch.zeros(width, dtype=torch.int64))
        self.history["personal"].append(mask)
        self.history["uploads"].append(int(uploads))
        self.history["scored"].append(scored)
        return self.personal

    def _update(self, conflicts: torch.Tensor, pairs: torch.Tensor) -> None:
        s = self.settings
        if s.schedule == "every_round":
            chosen = top_k_positive(conflicts, self.extra)
            self.personal = chosen if chosen else self.personal
        elif s.schedule == "warmup":
            if self.scored_rounds < s.warmup:
                self.conflicts += conflicts
                self.pairs += pairs
                if self.scored_rounds == s.warmup - 1:
                    self.personal = top_k_positive(self.conflicts, self.extra)
                    if not self.personal and self.extra > 0:
                        self.notes.append(f"FedLAG warm-up: no conflicting pair in {s.warmup} scored rounds "
                                          f"(--lag_xi {s.xi}); no layer is personalised")
        else:
            self.conflicts.mul_(s.decay).add_(conflicts)
            self.pairs.mul_(s.decay).add_(pairs)
            self.personal = hysteresis_choice(self.rates(), self.personal, self.extra, s.margin)
        self.scored_rounds += 1

    def rates(self) -> torch.Tensor:
        """The accumulated conflict rate of every layer."""
        return conflict_rates(self.conflicts, self.pairs)

    # ----- naming -----------------------------------------------------------------------------------------
    def personal_names(self) -> List[str]:
        """Parameter names of the personal layers."""
        return [name for i in self.personal for name in self.layers[i].tensors]

    def layer_names(self) -> List[str]:
        return [layer.name for layer in self.layers]

    # ----- state (checkpoints) ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"layers": [[layer.name, list(layer.tensors)] for layer in self.layers],
                "own_personal": list(self.own_personal), "personal": list(self.personal), "conflicts": self.conflicts.clone(), "pairs": self.pairs.clone(),
                "scored_rounds": self.scored_rounds, "history": {k: list(v) for k, v in self.history.items()}}

    @classmethod
    def from_state_dict(cls, settings: LagSettings, state: dict) -> "LayerSelector":
        selector = cls(settings, [Layer(name, tuple(tensors)) for name, tensors in state["layers"]], "the run",
                       state.get("own_personal", ()))
        selector.notes = []  # said when the run started
        selector.personal = tuple(int(i) for i in state["personal"])
        selector.conflicts = state["conflicts"].clone().double()
        selector.pairs = state["pairs"].clone().double()
        selector.scored_rounds = int(state["scored_rounds"])
        selector.history = {k: list(v) for k, v in state["history"].items()}
        return selector

    # ----- results ------------------------------------------------------------------------------------------
    def result_arrays(self, unscored_before: int = 0) -> Dict[str, object]:
        """The run's ``lag_*`` arrays, one row per round (``unscored_before`` rounds came before the layers
        were known: they are rows of zeros marked unscored).

        ``lag_conflict_scores[r, l]`` is GC_xi of layer l in round r, ``lag_pairs[r, l]`` the pairs it was
        counted over, ``lag_personal[r, l]`` the choice made at the end of round r (it applies from the next
        broadcast), ``lag_num_uploads[r]`` the clients scored and ``lag_scored[r]`` whether round r had
        evidence at all.
        """
        width = len(self.layers)
        h = self.history

        def rows(key: str, dtype: torch.dtype) -> torch.Tensor:
            pad = [torch.zeros(width, dtype=dtype)] * unscored_before
            values = pad + list(h[key])
            return torch.stack(values) if values else torch.zeros((0, width), dtype=dtype)
        return {"lag_layer_names": self.layer_names(), "lag_conflict_scores": rows("scores", torch.int64),
                "lag_pairs": rows("pairs", torch.int64), "lag_personal": rows("personal", torch.bool),
                "lag_num_uploads": torch.tensor([0] * unscored_before + h["uploads"], dtype=torch.int64),
                "lag_scored": torch.tensor([False] * unscored_before + h["scored"], dtype=torch.bool)}
