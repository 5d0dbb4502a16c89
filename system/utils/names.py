"""Closest-name suggestions for a mistyped name (an algorithm, a model, a dataset, a flag value)."""
from __future__ import annotations

import difflib
from typing import Iterable, List, Optional

# Below this similarity (difflib's ratio, 0..1) a suggestion is more likely noise than help.
SUGGESTION_CUTOFF = 0.7


def closest_names(name: str, choices: Iterable[str]) -> List[str]:
    """The valid names ``name`` was probably meant to be (several when they tie), or [].

    A case-insensitive match wins (``fedlag`` -> ``FedLAG``); otherwise the most similar names by
    difflib's ratio, compared in lower case so that case never costs similarity.
    """
    by_lower = {c.lower(): c for c in choices}
    wanted = name.lower()
    if wanted in by_lower:
        return [by_lower[wanted]]
    scores = {low: difflib.SequenceMatcher(None, wanted, low).ratio() for low in by_lower}
    top = max(scores.values(), default=0.0)
    if top < SUGGESTION_CUTOFF:
        return []
    return [by_lower[low] for low, score in scores.items() if score == top]


def closest_name(name: str, choices: Iterable[str]) -> Optional[str]:
    """The single most likely meant name (the first of :func:`closest_names`), or None."""
    names = closest_names(name, choices)
    return names[0] if names else None


def unknown_name_message(kind: str, name: str, choices: Iterable[str], listing: str = "",
                         where_listed: str = "") -> str:
    """``unknown <kind> 'x'; did you mean 'y'?`` (plus ``where_listed``, saying where the full list is),
    or, with no close name, the valid names (``listing`` replaces the plain comma-separated list)."""
    choices = list(choices)
    guesses = closest_names(name, choices)
    if guesses:
        return f"unknown {kind} {name!r}; did you mean {' or '.join(map(repr, guesses))}?{where_listed}"
    return f"unknown {kind} {name!r}; choose one of: {listing or ', '.join(choices)}"
