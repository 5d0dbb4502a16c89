"""Partition tokens of a grid (``dir0.1``, ``exdir0.5``, ``pat2``, ``iid``, ``-``), optionally followed
by a concept shift ``-lg<G>`` and a feature shift ``-rot<G>`` / ``-cor<G>...`` (``iid-lg4``,
``dir0.1-rot4``): the dataset folder each names and the generator flags that build it."""
from __future__ import annotations

import re
from typing import List, Optional

from dataset.utils.naming import feature_shift_from_word
from utils.dataset_hints import feature_shift_flags

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
    the token is not a partition (each shift at most once, the label shift first, as folder names
    spell them)."""
    scheme, *shifts = partition.split("-")
    flags = scheme_flags(scheme)
    if flags is None or len(shifts) > 2:
        return None
    if shifts and re.fullmatch("lg[1-9][0-9]*", shifts[0]):
        flags += ["--label-groups", shifts.pop(0)[len("lg"):]]
    if shifts:
        feature = feature_shift_from_word(shifts.pop(0))
        if feature is None or feature["feature_groups"] == 1:
            return None
        flags += feature_shift_flags(feature)
    return None if shifts else flags


def scheme_flags(partition: str) -> Optional[List[str]]:
    """The generator flags of a label partition alone (``dir0.1``), or None."""
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
