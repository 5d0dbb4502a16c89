"""Partition tokens of a grid (``dir0.1``, ``exdir0.5``, ``pat2``, ``iid``, ``-``), optionally followed
by a concept shift ``-lg<G>`` and a feature shift ``-rot<G>`` / ``-cor<G>...`` (``iid-lg4``,
``dir0.1-rot4``): the dataset folder each names and the generator flags that build it."""
from __future__ import annotations

import re
from typing import List, Optional

from dataset.utils.command_line import options_from_args, parse_args
from dataset.utils.naming import feature_shift_from_word
from dataset.utils.partition import PartitionError
from utils.dataset_hints import feature_shift_flags

# Every partition parameter a batch varies is in the folder name. The default client count names the
# folder D-P; any other count adds -nc<N>, so runs with two counts never share a folder. A D-P folder
# that holds another count anyway (built by hand) is not reused: the generator refuses to overwrite a
# different split, and main.py checks the files against config.json.
DEFAULT_CLIENTS = "20"
_NUMBER = r"[0-9]*\.?[0-9]+"
UNKNOWN_PARTITION = ("unknown partition '{}' (dir<alpha>, exdir<alpha>, pat<k>, iid or -; then optionally -lg<G> "
                     "and -rot<G> or -cor<G>, G >= 2)")


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
        if feature is None or feature["feature_groups"] < 2:  # one group (or none) is no shift
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


def partition_problem(partition: str, clients: str) -> Optional[str]:
    """Why ``dataset/generate_<D>.py`` would refuse ``partition`` for ``clients`` clients (a checked count),
    as far as it can tell before reading any data; None when it would not. Its own checks, run on the flags
    the batch would give it: label groups in 1..clients, a feature shift it can make (rot<G>: 2..4 quarter
    turns; cor<G>: a corruption for each group, a severity of 1-5), and the scheme's number: a positive
    Dirichlet alpha, at least one class per client (the upper bounds depend on the data)."""
    if partition == "-":
        return None
    flags = generator_flags(partition)
    if flags is None:
        return UNKNOWN_PARTITION.format(partition)
    scheme, number = flags[2], flags[4] if len(flags) > 4 else ""
    if scheme in ("dir", "exdir") and not float(number) > 0:
        return f"partition '{partition}': the Dirichlet alpha (--alpha) must be a positive number, got {number}"
    if scheme == "pat" and int(number) < 1:
        return f"partition '{partition}': each client needs at least one class (--class-per-client), got {number}"
    try:
        options_from_args(parse_args([*flags, "--num-clients", clients], "D", 2, None))
    except PartitionError as err:
        return f"partition '{partition}' cannot be built: {err}"
    return None
