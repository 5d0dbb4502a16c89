"""Partition tokens of a grid (``dir0.1``, ``exdir0.5``, ``pat2``, ``iid``, ``-``; any of the first four
with ``-lg<G>`` for concept shift, ``iid-lg4``): the dataset folder each names and the generator flags
that build it."""
from __future__ import annotations

import re
from typing import List, Optional

# Every partition parameter a batch varies is in the folder name. The default client count names the
# folder D-P; any other count adds -nc<N>, so runs with two counts never share a folder. A D-P folder
# that holds another count anyway (built by hand) is not reused: the generator refuses to overwrite a
# different split, and main.py checks the files against config.json.
DEFAULT_CLIENTS = "20"
_NUMBER = r"[0-9]*\.?[0-9]+"


def folder_name(dataset: str, partition: str, clients: str) -> str:
    """``D`` for partition ``-`` (the folder as it is), ``D-P``, or ``D-P-nc<N>``. ``clients`` is compared
    as written, not as a number (``020`` names ``D-P-nc020``): like every number of a grid, it goes into
    names as the grid spells it."""
    if partition == "-":
        return dataset
    if clients == DEFAULT_CLIENTS:
        return f"{dataset}-{partition}"
    return f"{dataset}-{partition}-nc{clients}"


def generator_flags(partition: str) -> Optional[List[str]]:
    """Positional arguments and options of ``dataset/generate_<D>.py`` for ``partition``, or None when
    the token is not a partition. ``<P>-lg<G>`` is partition P with ``--label-groups G``: client i sees
    the labels through group i % G's permutation."""
    grouped = re.fullmatch(r"(.+)-lg([1-9][0-9]*)", partition)
    if grouped:
        flags = _scheme_flags(grouped.group(1))
        return None if flags is None else flags + ["--label-groups", grouped.group(2)]
    return _scheme_flags(partition)


def _scheme_flags(partition: str) -> Optional[List[str]]:
    if partition == "iid":
        return ["iid", "-", "-"]
    for scheme in ("dir", "exdir"):
        if partition.startswith(scheme):
            alpha = partition[len(scheme):]
            return ["noniid", "-", scheme, "--alpha", alpha] if re.fullmatch(_NUMBER, alpha) else None
    if partition.startswith("pat"):
        classes = partition[len("pat"):]
        return ["noniid", "-", "pat", "--class-per-client", classes] if re.fullmatch("[0-9]+", classes) else None
    return None
