"""FedLAG's layer choice as one plain object: the conflict evidence gathered round by round, the rule
that turns it into a set of personal layers, the history of both, and their state for checkpoints.

Three rules (``--lag_schedule``):

* ``smoothed`` (the default, chosen by measurement: ``benchmarks/fedlag_stability.py`` and
  ``benchmarks/fedlag_few_uploads.py``). The evidence of every scored pair is summed over the rounds with
  a decay ``--lag_decay`` per scored round, so a round with 6 pairs (4 uploads) weighs what it knows and
  no more, and a round with no pair changes nothing. Layers are ranked by how far apart their updates
  point: the accumulated *mean pairwise cosine*, lowest first, among the layers with at least one
  conflicting pair (cosine < xi). A free place of the personal set fills at once, with the layer nearest
  the output among those the evidence does not separate from the lowest (see :func:`~.choice.evidence_choice`;
  docs/fedlag.md has the measurements behind it). An incumbent gives way only on evidence: to a challenger whose updates conflict on average (mean cosine below xi) and whose cosines,
  over the pairs scored in both, are lower than the incumbent's by more than ``--lag_margin`` standard
  errors of that paired difference. A layer that returns from personal to shared has every client's
  copy replaced by one average, so returns must be rare and deliberate.

  Why the mean cosine and not the conflict rate (GC / pairs): under label skew every layer's updates
  conflict for most pairs (rates of 0.6-0.8 for all four layers of the CNN on the Digits split), so the
  rates of the head and the layer below it tie within noise, and a round of 6 pairs gives ties of 6 of 6
  that went to the earlier layer. The cosines of the same pair move together across layers, and the
  head's are the lowest in almost every round: at 4 uploads a round the round-0 mean already names the
  head in 11 of 12 seeds, where the rate named it in 5.
* ``every_round``: the paper's Algorithm 1, the top-K of each round's own counts.
* ``warmup``: the authors' code, counts summed over the first W scored rounds, then frozen.
* ``random``: a control for the ranking (the paper's reviewers asked for it): K layers drawn once per run
  from a stream seeded by the run's seed, personal from the first round; the evidence is still recorded.

In every rule but ``random`` a layer with no conflict at all is never chosen (with no evidence, nothing new is
personalised), and a round with fewer than two uploads is recorded but changes nothing. Equal scores rank
the earlier layer first, so the choice depends on the evidence alone, not on the order clients uploaded in.

The rules' arithmetic is in ``choice.py`` (pure functions); this module holds the state they read and
write. The knobs themselves, and their ``--lag_*`` flags, are :class:`~.settings.LagSettings`. Imports only
torch, so ``lag/`` can be copied into a PFLlib checkout unchanged.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .choice import conflict_rates, evidence_choice, mean_cosines, paired_lead, random_layers, top_k_positive
from .conflict import Layer, LayerEvidence
from .settings import LagError, LagSettings


EVIDENCE = ("conflicts", "pairs", "cosine_sums", "gap_sums", "gap_squares", "common_pairs")
HISTORY = ("scores", "pairs", "cosines", "personal", "uploads", "scored")


# ----- the object ------------------------------------------------------------------------------------------
class LayerSelector:
    """The candidate layers, the personal set, the accumulated evidence and the per-round history."""

    def __init__(self, settings: LagSettings, layers: Sequence[Layer], method: str = "the base method",
                 own_personal: Sequence[str] = (), seed: int = 0):
        """``layers``: the candidates, i.e. what ``method`` shares. ``own_personal``: the layers ``method``
        already keeps personal by design (FedRep's head), at the same granularity.

        K is the size of the personal part: ``method``'s own layers count towards it, so only
        ``K - len(own_personal)`` shared layers are ever added (FedRep+LAG with K = 1 is FedRep). Measured:
        an extra personal base layer is trained only when its client is sampled, and cost FedROD and
        FedAS 0.2-1.8 points at 20% participation. A K that would keep every shared layer personal is
        refused: that is training each client alone (Local), not FedLAG. ``seed``: the ``random`` rule's
        stream (the run's seed), drawn from once here."""
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
        self.personal: Tuple[int, ...] = (random_layers(len(self.layers), self.extra, seed)
                                          if settings.schedule == "random" else ())
        width = len(self.layers)
        # The evidence so far: decayed (smoothed) or summed (warmup) over the scored rounds.
        self.conflicts = torch.zeros(width, dtype=torch.float64)
        self.pairs = torch.zeros(width, dtype=torch.float64)
        self.cosine_sums = torch.zeros(width, dtype=torch.float64)
        self.gap_sums = torch.zeros((width, width), dtype=torch.float64)
        self.gap_squares = torch.zeros((width, width), dtype=torch.float64)
        self.common_pairs = torch.zeros((width, width), dtype=torch.float64)
        self.scored_rounds = 0
        self.history: Dict[str, list] = {key: [] for key in HISTORY}

    @property
    def extra(self) -> int:
        """How many shared layers may become personal: K less the layers the base method keeps itself."""
        return max(0, self.settings.top_k - len(self.own_personal))

    # ----- one round ----------------------------------------------------------------------------------------
    def observe(self, evidence: Optional[LayerEvidence], uploads: int) -> Tuple[int, ...]:
        """Take one round's evidence (None when it could not be scored) and return the personal set.

        The choice applies from the next broadcast. Every call adds one history row.
        """
        width = len(self.layers)
        scored = evidence is not None and bool((evidence.pairs > 0).any())
        if scored:
            self._update(evidence)
        mask = torch.zeros(width, dtype=torch.bool)
        mask[list(self.personal)] = True
        zeros = torch.zeros(width, dtype=torch.int64)
        self.history["scores"].append(evidence.conflicts.to(torch.int64) if scored else zeros)
        self.history["pairs"].append(evidence.pairs.to(torch.int64) if scored else zeros)
        self.history["cosines"].append(evidence.mean_cosines() if scored else torch.full((width,), float("nan"),
                                                                                          dtype=torch.float64))
        self.history["personal"].append(mask)
        self.history["uploads"].append(int(uploads))
        self.history["scored"].append(scored)
        return self.personal

    def _accumulate(self, evidence: LayerEvidence, decay: float) -> None:
        for name in ("conflicts", "pairs", "cosine_sums", "gap_sums", "gap_squares", "common_pairs"):
            getattr(self, name).mul_(decay).add_(getattr(evidence, name).double())

    def _update(self, evidence: LayerEvidence) -> None:
        s = self.settings
        if s.schedule == "every_round":
            chosen = top_k_positive(evidence.conflicts, self.extra)
            self.personal = chosen if chosen else self.personal
        elif s.schedule == "random":
            pass  # drawn once, at the start
        elif s.schedule == "warmup":
            if self.scored_rounds < s.warmup:
                self._accumulate(evidence, 1.0)
                if self.scored_rounds == s.warmup - 1:
                    self.personal = top_k_positive(self.conflicts, self.extra)
                    if not self.personal and self.extra > 0:
                        self.notes.append(f"FedLAG warm-up: no conflicting pair in {s.warmup} scored rounds "
                                          f"(--lag_xi {s.xi}); no layer is personalised")
        else:
            self._accumulate(evidence, s.decay)
            self.personal = evidence_choice(self.mean_cosines(), self.conflicts > 0, self.lead, self.personal,
                                            self.extra, s.margin, s.xi)
        self.scored_rounds += 1

    def rates(self) -> torch.Tensor:
        """The accumulated conflict rate of every layer."""
        return conflict_rates(self.conflicts, self.pairs)

    def mean_cosines(self) -> torch.Tensor:
        """The accumulated mean pairwise cosine of every layer."""
        return mean_cosines(self.cosine_sums, self.pairs)

    def lead(self, challenger: int, incumbent: int) -> float:
        """Standard errors by which ``challenger``'s accumulated cosines lie below ``incumbent``'s."""
        return paired_lead(self.gap_sums, self.gap_squares, self.common_pairs, challenger, incumbent)

    # ----- naming -----------------------------------------------------------------------------------------
    def personal_names(self) -> List[str]:
        """Parameter names of the personal layers."""
        return [name for i in self.personal for name in self.layers[i].tensors]

    def layer_names(self) -> List[str]:
        return [layer.name for layer in self.layers]

    # ----- state (checkpoints) ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"layers": [[layer.name, list(layer.tensors)] for layer in self.layers],
                "own_personal": list(self.own_personal), "personal": list(self.personal),
                **{name: getattr(self, name).clone() for name in EVIDENCE},
                "scored_rounds": self.scored_rounds, "history": {k: list(v) for k, v in self.history.items()}}

    @classmethod
    def from_state_dict(cls, settings: LagSettings, state: dict) -> "LayerSelector":
        selector = cls(settings, [Layer(name, tuple(tensors)) for name, tensors in state["layers"]], "the run",
                       state.get("own_personal", ()))
        selector.notes = []  # said when the run started
        selector.personal = tuple(int(i) for i in state["personal"])
        for name in EVIDENCE:
            setattr(selector, name, state[name].clone().double())
        selector.scored_rounds = int(state["scored_rounds"])
        selector.history = {k: list(v) for k, v in state["history"].items()}
        return selector

    # ----- results ------------------------------------------------------------------------------------------
    def result_arrays(self, unscored_before: int = 0) -> Dict[str, object]:
        """The run's ``lag_*`` arrays, one row per round (``unscored_before`` rounds came before the layers
        were known: they are rows of zeros marked unscored).

        ``lag_conflict_scores[r, l]`` is GC_xi of layer l in round r, ``lag_pairs[r, l]`` the pairs it was
        counted over, ``lag_mean_cosines[r, l]`` their mean cosine (NaN without pairs), ``lag_personal[r, l]``
        the choice made at the end of round r (it applies from the next broadcast), ``lag_num_uploads[r]``
        the clients scored and ``lag_scored[r]`` whether round r had evidence at all.
        """
        width = len(self.layers)
        h = self.history

        def rows(key: str, dtype: torch.dtype, fill=0) -> torch.Tensor:
            pad = [torch.full((width,), fill, dtype=dtype)] * unscored_before
            values = pad + list(h[key])
            return torch.stack(values) if values else torch.zeros((0, width), dtype=dtype)
        return {"lag_layer_names": self.layer_names(), "lag_conflict_scores": rows("scores", torch.int64),
                "lag_pairs": rows("pairs", torch.int64),
                "lag_mean_cosines": rows("cosines", torch.float64, float("nan")),
                "lag_personal": rows("personal", torch.bool),
                "lag_num_uploads": torch.tensor([0] * unscored_before + h["uploads"], dtype=torch.int64),
                "lag_scored": torch.tensor([False] * unscored_before + h["scored"], dtype=torch.bool)}
