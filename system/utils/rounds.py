"""What ``-gr N`` means, in words: PFLlib's round loop trains rounds 0..N, one more than N.

Kept apart from :mod:`utils.progress` (which imports torch) so that the grid runner can say it too
without paying for torch's import.
"""
from __future__ import annotations


def rounds_run(global_rounds: int) -> str:
    """``rounds 0..1 (2 rounds)`` for ``-gr 1``; ``round 0 (1 round)`` for ``-gr 0``."""
    if global_rounds == 0:
        return "round 0 (1 round)"
    return f"rounds 0..{global_rounds} ({global_rounds + 1} rounds)"
