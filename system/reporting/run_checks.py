"""What a run file must hold before a report uses it: the values the tables and plots read, of the kind
and range they assume. A file that does not is left out, with the reason, while the rest is reported.

Accuracies are fractions in [0, 1]; a series that holds text, bytes, a table instead of a row, or values
outside that range (``inf``, 5.0) was not written by a run, and averaging it would show a wrong number
rather than none.
"""
from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

# Series of one accuracy per evaluation, besides rs_test_acc, that the statistics read when present.
# Validation and after-training series may hold NaN where a round had nothing to evaluate.
OPTIONAL_SERIES = ("rs_val_acc", "rs_after_test_acc")
# Whole numbers, counts or flags: the attributes a report reads from a run file.
INTEGER_KINDS = "iu"
NUMBER_KINDS = "iuf"


def run_file_problem(arrays: Mapping[str, np.ndarray], attrs: Mapping[str, object]) -> Optional[str]:
    """Why a report cannot use the run whose file holds ``arrays`` and ``attrs``, or None when it can. Each
    series is checked when present: a run without one is reported without the statistics it gives."""
    series = [("rs_test_acc", 1, False), *((name, 1, True) for name in OPTIONAL_SERIES), ("rs_client_acc", 2, True)]
    problems = (_fractions_problem(arrays[name], name, ndim, nan) for name, ndim, nan in series if name in arrays)
    return _attrs_problem(attrs) or next((p for p in problems if p), None) or _rounds_problem(arrays) \
        or _conflicts_problem(arrays)


def _attrs_problem(attrs: Mapping[str, object]) -> Optional[str]:
    complete = attrs.get("complete", True)  # PFLlib writes its files at the end only: complete
    if not (isinstance(complete, (bool, np.bool_)) or (_is_whole(complete) and complete in (0, 1))):
        return f"attribute complete is {complete!r}, not true or false"
    run = attrs.get("run", 0)
    if not _is_whole(run) or run < 0:
        return f"attribute run is {run!r}, not a run index"
    config = attrs.get("config")
    if isinstance(config, dict):
        gap = config.get("eval_gap", 1)
        if gap is not None and (not _is_whole(gap) or gap < 1):
            return f"its config's eval_gap is {gap!r}, not a positive whole number"
        if config.get("data_dir") is not None and not isinstance(config["data_dir"], str):
            return f"its config's data_dir is {config['data_dir']!r}, not a folder"
    return None


def _fractions_problem(values: np.ndarray, name: str, ndim: int, nan: bool) -> Optional[str]:
    """Why ``values`` (the array ``name``) is not ``ndim``-D fractions in [0, 1] (NaN allowed with ``nan``)."""
    if values.size == 0:
        return None  # nothing recorded (a run stopped before its first evaluation): nothing to misreport
    problem = _kind_problem(name, values, NUMBER_KINDS, "numbers")
    if problem:
        return problem
    if values.ndim != ndim:
        return f"{name} has shape {values.shape}, not {'one value per evaluation' if ndim == 1 else 'a table'}"
    numbers = values.astype(float)
    bad = ~(np.isnan(numbers) if nan else np.zeros(numbers.shape, dtype=bool)) & ~((numbers >= 0) & (numbers <= 1))
    if bad.any():
        return f"{name} holds {float(numbers[bad].flat[0])!r}, not an accuracy in [0, 1]"
    return None


def _rounds_problem(arrays: Mapping[str, np.ndarray]) -> Optional[str]:
    rounds = arrays.get("rs_eval_round")
    if rounds is None or rounds.size == 0:
        return None
    return _kind_problem("rs_eval_round", rounds, INTEGER_KINDS, "round numbers") or (
        None if rounds.ndim == 1 and (rounds >= 0).all() else "rs_eval_round is not one round number per evaluation")


def _conflicts_problem(arrays: Mapping[str, np.ndarray]) -> Optional[str]:
    """The conflict records a heatmap draws: scores (rounds x layers), a name per layer, and per round the
    personal layers and the uploads scored."""
    scores = arrays.get("lag_conflict_scores")
    if scores is None:
        return None
    problem = _kind_problem("lag_conflict_scores", scores, NUMBER_KINDS, "numbers")
    if problem or scores.ndim != 2:
        return problem or f"lag_conflict_scores has shape {scores.shape}, not rounds x layers"
    if not np.isfinite(scores.astype(float)).all() or (scores < 0).any():
        return "lag_conflict_scores holds values that are not counts of client pairs"
    names = arrays.get("lag_layer_names")
    if names is None or names.ndim != 1 or len(names) != scores.shape[1] or names.dtype.kind not in "SU":
        return f"lag_layer_names is not one name per layer of lag_conflict_scores ({scores.shape[1]})"
    personal = arrays.get("lag_personal")
    if personal is not None and (personal.dtype.kind not in "biu" or personal.shape != scores.shape):
        return f"lag_personal is not one flag per round and layer ({scores.shape})"
    uploads = arrays.get("lag_num_uploads")
    if uploads is not None and (uploads.dtype.kind not in INTEGER_KINDS or uploads.shape != scores.shape[:1]):
        return f"lag_num_uploads is not one count per round ({scores.shape[0]})"
    return None


def _kind_problem(name: str, values: np.ndarray, kinds: str, what: str) -> Optional[str]:
    if values.dtype.kind not in kinds:
        shown = {"S": "bytes", "U": "text", "O": "objects", "V": "raw bytes", "b": "true/false values"}
        return f"{name} holds {shown.get(values.dtype.kind, values.dtype.name)}, not {what}"
    return None


def _is_whole(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def groups_problem(arrays: Mapping[str, np.ndarray], config: Mapping[str, object]) -> Optional[str]:
    """Why ``lag_groups`` (rounds x layers x clients, each client's group or -1) cannot be drawn as the groups
    of the run whose file holds ``arrays`` and whose flags are ``config``, or None when it can (or is absent).

    A table of another shape than the run (99 clients for ``-nc 8``, other rounds than its conflict scores)
    would draw clients and rounds the run never had: that figure is refused, the rest of the run is reported.
    """
    groups = arrays.get("lag_groups")
    if groups is None:
        return None
    problem = _kind_problem("lag_groups", groups, INTEGER_KINDS, "group numbers")
    if problem or groups.ndim != 3:
        return problem or f"lag_groups has shape {groups.shape}, not rounds x layers x clients"
    rounds, layers, clients = groups.shape
    scores = arrays.get("lag_conflict_scores")
    if scores is None or scores.ndim != 2:
        return "lag_groups without conflict scores (lag_conflict_scores) to match its rounds and layers"
    if (rounds, layers) != scores.shape:
        return (f"lag_groups has {rounds} rounds x {layers} layers, lag_conflict_scores {scores.shape[0]} x "
                f"{scores.shape[1]}")
    expected, source = _clients_of(arrays, config)
    if expected is not None and clients != expected:
        return f"lag_groups has {clients} clients, the run {expected} ({source})"
    outside = groups[(groups < -1) | (groups >= clients)]
    if outside.size:
        return f"lag_groups holds group {int(outside.flat[0])}, not -1 or one of the {clients} client ids"
    personal = arrays.get("lag_personal")
    if personal is not None and personal.shape == scores.shape and \
            ((groups >= 0) != personal.astype(bool)[:, :, None]).any():
        return "lag_groups gives groups where lag_personal says the layer was shared, or none where it was personal"
    return None


def _clients_of(arrays: Mapping[str, np.ndarray], config: Mapping[str, object]):
    """(number of clients, where it comes from) of a run: its -nc, else the columns of rs_client_acc."""
    if _is_whole(config.get("num_clients")):
        return int(config["num_clients"]), f"-nc {config['num_clients']}"
    table = arrays.get("rs_client_acc")
    if table is not None and table.ndim == 2 and table.shape[1] > 0:
        return table.shape[1], "the columns of rs_client_acc"
    return None, ""
