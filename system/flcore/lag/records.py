"""What FedLAG keeps of a run: its state for checkpoints and its ``lag_*`` arrays for the results.

The state is the layer choice (:class:`~.selector.LayerSelector`, evidence and history), the rounds that
ended before the candidate layers were known, and with ``--lag_share groups`` the profiles, each round's
groups and the group models the next broadcast delivers (:class:`~.sharing.GroupSharing`). Plain
containers of tensors and numbers, so a checkpoint loads with ``weights_only=True``. Imports only torch.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from .selector import LayerSelector
from .settings import LagSettings
from .sharing import GroupSharing


def lag_state(settings: LagSettings, selector: Optional[LayerSelector], unscored_before: int,
              sharing: Optional[GroupSharing]) -> dict:
    """``{"selector", "unscored_before"}``, and ``"groups"`` with ``--lag_share groups``."""
    state = {"selector": None if selector is None else selector.state_dict(), "unscored_before": unscored_before}
    if settings.share == "groups":
        state["groups"] = sharing.state_dict() if sharing is not None else {"profiles": None, "history": []}
    return state


def load_lag_state(settings: LagSettings, state: dict, sharing: Optional[GroupSharing],
                   new_sharing) -> Tuple[Optional[LayerSelector], int, Optional[GroupSharing]]:
    """``(selector, unscored_before, sharing)`` from :func:`lag_state`'s output. ``sharing``: the live one,
    kept where the state has no groups yet; ``new_sharing()`` makes an empty one to load them into."""
    saved = state["selector"]
    selector = None if saved is None else LayerSelector.from_state_dict(settings, saved)
    groups = state.get("groups")
    if settings.share == "groups" and groups is not None and groups["profiles"] is not None:
        sharing = new_sharing()
        sharing.load_state_dict(groups)
    return selector, int(state["unscored_before"]), sharing


def lag_results(selector: Optional[LayerSelector], unscored_before: int,
                sharing: Optional[GroupSharing]) -> Dict[str, object]:
    """The ``lag_*`` arrays for the run's .h5, one row per round (see ``LayerSelector.result_arrays``), and
    ``lag_groups`` (rounds x layers x clients) with ``--lag_share groups``."""
    if selector is None:
        empty = torch.zeros((unscored_before, 0))
        return {"lag_layer_names": [], "lag_conflict_scores": empty.long(), "lag_pairs": empty.long(),
                "lag_mean_cosines": empty.double(), "lag_personal": empty.bool(),
                "lag_num_uploads": torch.zeros(unscored_before, dtype=torch.int64),
                "lag_scored": torch.zeros(unscored_before, dtype=torch.bool)}
    arrays = selector.result_arrays(unscored_before=unscored_before)
    if sharing is not None:
        arrays["lag_groups"] = sharing.result_rows(unscored_before, len(selector.layers))
    return arrays
