"""What FedLAG keeps of a run: its state for checkpoints and its ``lag_*`` arrays for the results.

The state is the layer choice (:class:`~.selector.LayerSelector`, evidence and history), the rounds that
ended before the candidate layers were known, and with ``--lag_share groups`` the profiles, each round's
groups and the group models the next broadcast delivers (:class:`~.sharing.GroupSharing`). Plain
containers of tensors and numbers, so a checkpoint loads with ``weights_only=True``. Imports only torch.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Dict, Optional, Tuple

import torch

from .checked_copies import CheckedCopies
from .selector import LayerSelector
from .settings import LagSettings
from .sharing import GroupSharing


def lag_state(settings: LagSettings, selector: Optional[LayerSelector], unscored_before: int,
              sharing: Optional[GroupSharing], check: Optional[CheckedCopies] = None) -> dict:
    """``{"selector", "unscored_before"}``, ``"groups"`` with ``--lag_share groups`` or ``check``, and
    ``"check"`` with ``check``."""
    state = {"selector": None if selector is None else selector.state_dict(), "unscored_before": unscored_before}
    if settings.share in ("groups", "check"):
        state["groups"] = sharing.state_dict() if sharing is not None else {"profiles": None, "history": []}
    if settings.share == "check":
        state["check"] = None if check is None else check.state_dict()
    return state


def load_lag_state(settings: LagSettings, state: dict, sharing: Optional[GroupSharing], new_sharing,
                   check: Optional[CheckedCopies] = None, new_check=None
                   ) -> Tuple[Optional[LayerSelector], int, Optional[GroupSharing], Optional[CheckedCopies]]:
    """``(selector, unscored_before, sharing, check)`` from :func:`lag_state`'s output. ``sharing`` and
    ``check``: the live ones, kept where the state has none yet; ``new_sharing()`` and ``new_check()`` make
    empty ones to load them into."""
    saved = state["selector"]
    selector = None if saved is None else LayerSelector.from_state_dict(settings, saved)
    groups = state.get("groups")
    if settings.share in ("groups", "check") and groups is not None and groups["profiles"] is not None:
        sharing = new_sharing()
        sharing.load_state_dict(groups)
    if settings.share == "check" and state.get("check") is not None:
        check = new_check()
        check.load_state_dict(state["check"])
    return selector, int(state["unscored_before"]), sharing, check


def lag_results(selector: Optional[LayerSelector], unscored_before: int, sharing: Optional[GroupSharing],
                check: Optional[CheckedCopies] = None) -> Dict[str, object]:
    """The ``lag_*`` arrays for the run's .h5, one row per round (see ``LayerSelector.result_arrays``),
    ``lag_groups`` (rounds x layers x clients) with ``--lag_share groups`` or ``check``, and with ``check``
    ``lag_copies`` (the same shape: 0 own, 1 group, 2 all, -1 shared)."""
    if selector is None:
        empty = torch.zeros((unscored_before, 0))
        return {"lag_layer_names": [], "lag_conflict_scores": empty.long(), "lag_pairs": empty.long(),
                "lag_mean_cosines": empty.double(), "lag_personal": empty.bool(),
                "lag_num_uploads": torch.zeros(unscored_before, dtype=torch.int64),
                "lag_scored": torch.zeros(unscored_before, dtype=torch.bool)}
    arrays = selector.result_arrays(unscored_before=unscored_before)
    if sharing is not None:
        arrays["lag_groups"] = sharing.result_rows(unscored_before, len(selector.layers))
    if check is not None:
        arrays["lag_copies"] = check.choices.result_rows(unscored_before, len(selector.layers))
    return arrays


class LagRecords:
    """The part of :class:`~.mixin.LayerConflictMixin` that saves and restores its state and writes its
    results, through the functions above (the mixin derives from it, so these hooks run before the base
    server's)."""

    def lag_state(self) -> dict:
        return lag_state(self.lag, self.lag_selector, self._lag_unscored_before, self.lag_sharing, self.lag_check)

    def load_lag_state(self, state: dict) -> None:
        self.lag_selector, self._lag_unscored_before, self.lag_sharing, self.lag_check = load_lag_state(
            self.lag, state, self.lag_sharing, self._lag_new_sharing, self.lag_check, self._lag_new_check)
        self.lag_updates.forget_layout()  # rebuilt from the layers at the next upload

    def extra_state(self) -> dict:
        return {**super().extra_state(), "lag": self.lag_state()}

    def get_state(self):
        state = super().get_state()
        state["lag"] = self.lag_state()
        return state

    def set_state(self, state):
        state = dict(state)
        self.load_lag_state(state.pop("lag"))
        super().set_state(state)

    def lag_results(self) -> Dict[str, object]:
        """The ``lag_*`` arrays for the run's .h5, one row per round (``records.lag_results``)."""
        return lag_results(self.lag_selector, self._lag_unscored_before, self.lag_sharing, self.lag_check)

    def result_arrays(self):
        arrays = super().result_arrays()
        arrays.update(self.lag_results())
        return arrays

    def result_attrs(self):
        attrs = super().result_attrs()
        attrs["lag"] = asdict(self.lag)
        return attrs
