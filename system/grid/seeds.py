"""A grid's seeds, ``0 1 2``, ``0-4`` or both, read as ranges: how many there are, and whether a run can be
seeded with each, is known before any list is made, so ``0-99999999999`` is refused by its count instead
of filling the memory."""
from __future__ import annotations

import re
from typing import List, Optional, Tuple

from grid.values import list_items

Span = Tuple[int, int]  # the first and the last seed of a range, both included


def seed_spans(text: str) -> Tuple[List[Span], List[str]]:
    """The ranges ``text`` lists (``7`` is ``(7, 7)``; ``007`` is 7), and a problem for each word that is
    not a seed or a forward range."""
    spans, problems = [], []
    for token in list_items(text):
        span = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", token)
        if not span:
            problems.append(f"seed '{token}' is not a number or a range like 0-4")
            continue
        first, last = int(span.group(1)), int(span.group(2) or span.group(1))
        if last < first:
            problems.append(f"seed range '{token}' runs backwards (write {last}-{first})")
        else:
            spans.append((first, last))
    return spans, problems


def seed_count(spans: List[Span]) -> int:
    """How many different seeds ``spans`` hold, counted from the merged ranges, never listed."""
    count, covered = 0, -1  # seeds up to ``covered`` are counted
    for first, last in sorted(spans):
        if last > covered:
            count += last - max(first, covered + 1) + 1
            covered = last
    return count


def seed_list(spans: List[Span]) -> List[int]:
    """Each seed once, in the order of first appearance: a seed listed twice (or in two ranges) would be the
    same run twice, concurrently with -j. Only for spans whose :func:`seed_count` is bounded."""
    return list(dict.fromkeys(seed for first, last in spans for seed in range(first, last + 1)))


def seed_range_problem(spans: List[Span]) -> Optional[str]:
    """Why some seed cannot seed a run (grid seed ``s`` is main.py's ``--seed 0 -pv s``, seeded with s), or
    None."""
    # Imported here: utils.seeding imports torch, which --help and the cheaper refusals do without.
    from utils.seeding import MAX_SEED
    above = [f"{first}-{last}" if first != last else str(last) for first, last in spans if last > MAX_SEED]
    if not above:
        return None
    return (f"seed{'s' if len(above) > 1 else ''} {', '.join(above)} go{'' if len(above) > 1 else 'es'} above "
            f"{MAX_SEED}, the largest seed a run can use (NumPy's seeding takes 0..2**32-1)")
