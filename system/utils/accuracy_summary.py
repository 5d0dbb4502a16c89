"""One run's accuracy series reduced to the numbers a table reports: best, final, the mean of the last k
evaluations, and how the clients spread at the final evaluation.

The training loop (written to the ``.h5`` as the ``summary`` attribute, printed by ``main.py``) and the
reports (recomputed from the arrays, so files from before this module are reported the same way) both
call :func:`summary_from_arrays`, so a number means the same thing wherever it is printed.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping, Optional, Sequence

import numpy as np

# --report_last_k's default, and report.py's when the runs recorded none.
DEFAULT_LAST_K = 10


@dataclass(frozen=True)
class AccuracySummary:
    """Accuracies are fractions in [0, 1]; NaN where the run recorded nothing to compute them from."""
    best: float                # max over evaluations (PFLlib's headline number)
    final: float               # the last evaluation
    last_k: int                # the k asked for (--report_last_k)
    last_k_count: int          # evaluations averaged: min(k, evaluations recorded)
    last_k_mean: float         # mean of the last last_k_count evaluations
    clients: int               # clients in the final evaluation (0: no per-client accuracies recorded)
    # The clients' final accuracies averaged with equal weight: beside "final" (weighted by test samples,
    # as PFLlib reports), it shows when a few large clients carry the weighted figure.
    final_client_mean: float
    final_client_std: float    # population std of the clients' final accuracies (PFLlib's "Std")
    final_worst10_mean: float  # mean final accuracy of the worst_count(clients) lowest clients
    # With --val_ratio: the test accuracy at the evaluation of highest validation accuracy (the first such),
    # i.e. "best" without choosing the round on the test set. NaN without a validation series.
    test_at_best_val: float = float("nan")
    # With --eval_after_training: the same best and final of the series after local training (the
    # round's trained clients). NaN without it.
    after_best: float = float("nan")
    after_final: float = float("nan")

    def as_attrs(self) -> dict:
        """The fields, less the optional statistics the run has no series for (so the ``.h5`` of a run
        without --val_ratio or --eval_after_training reads as before they existed)."""
        return {k: v for k, v in asdict(self).items() if not (k in OPTIONAL_FIELDS and np.isnan(v))}


# Fields computed only from the series of an optional flag.
OPTIONAL_FIELDS = ("test_at_best_val", "after_best", "after_final")


def worst_count(clients: int) -> int:
    """How many clients "the worst 10%" holds: ceil(clients / 10), at least one (for clients >= 1).

    Integer arithmetic on purpose: ``math.ceil(0.1 * 30)`` is 4, because 0.1 * 30 is 3.0000000000000004.
    """
    return max(1, (clients + 9) // 10) if clients > 0 else 0


def summarize_accuracy(accuracy: Sequence[float], final_client_accuracy: Optional[Sequence[float]],
                       last_k: int = DEFAULT_LAST_K, validation: Optional[Sequence[float]] = None,
                       after_training: Optional[Sequence[float]] = None) -> AccuracySummary:
    """The summary of one run from its accuracy per evaluation (sample-weighted over clients, as
    ``rs_test_acc``) and each client's accuracy at the final evaluation (None when not recorded);
    ``validation`` (one per evaluation) and ``after_training`` are the optional series of ``--val_ratio``
    and ``--eval_after_training``.

    ``last_k`` counts evaluations, not rounds (with ``-eg 5`` the last 10 evaluations span 50 rounds);
    a run with fewer evaluations averages all of them.
    """
    if last_k < 1:
        raise ValueError(f"last_k must be >= 1, got {last_k}")
    series = np.asarray(accuracy, dtype=float).ravel()
    after = np.asarray(after_training if after_training is not None else [], dtype=float).ravel()
    count = min(last_k, len(series))
    nan = float("nan")
    clients = np.sort(np.asarray(final_client_accuracy if final_client_accuracy is not None else [], dtype=float))
    worst = worst_count(len(clients))
    return AccuracySummary(
        best=float(np.max(series)) if len(series) else nan,
        final=float(series[-1]) if len(series) else nan,
        last_k=int(last_k),
        last_k_count=count,
        last_k_mean=float(np.mean(series[-count:])) if count else nan,
        clients=len(clients),
        final_client_mean=float(np.mean(clients)) if len(clients) else nan,
        final_client_std=float(np.std(clients)) if len(clients) else nan,
        final_worst10_mean=float(np.mean(clients[:worst])) if worst else nan,
        test_at_best_val=_at_best(series, validation),
        after_best=float(np.max(after)) if len(after) else nan,
        after_final=float(after[-1]) if len(after) else nan,
    )


def _at_best(series: np.ndarray, validation: Optional[Sequence[float]]) -> float:
    """``series`` at the first maximum of ``validation`` (NaN unless both have one value per evaluation)."""
    values = np.asarray(validation if validation is not None else [], dtype=float).ravel()
    if len(values) == 0 or len(values) != len(series) or np.isnan(values).all():
        return float("nan")
    return float(series[int(np.nanargmax(values))])


def final_client_accuracy(arrays: Mapping[str, object]) -> Optional[np.ndarray]:
    """Each client's accuracy at the final evaluation: the last row of ``rs_client_acc`` (evaluations x
    clients), or None when there is none that belongs to the last entry of ``rs_test_acc`` (PFLlib's
    files record no per-client accuracies; a Flower run whose evaluated clients changed records an
    empty table; a table of another length cannot be matched to the evaluations)."""
    rows = arrays.get("rs_client_acc")
    evaluations = len(np.asarray(arrays.get("rs_test_acc", []), dtype=float).ravel())
    if rows is None or evaluations == 0:
        return None
    try:  # a list of per-evaluation arrays (a live history) or the .h5 table
        table = np.asarray(rows, dtype=float)
    except ValueError:  # rows of different lengths: not one table of clients
        return None
    if table.ndim != 2 or table.shape[0] != evaluations or table.shape[1] == 0:
        return None
    return table[-1]


def summary_from_arrays(arrays: Mapping[str, object], last_k: int = DEFAULT_LAST_K) -> AccuracySummary:
    """:func:`summarize_accuracy` of a run's ``rs_test_acc`` and ``rs_client_acc`` (a server's history or
    the arrays read back from its ``.h5``)."""
    return summarize_accuracy(arrays.get("rs_test_acc", []), final_client_accuracy(arrays), last_k,
                              validation=arrays.get("rs_val_acc"), after_training=arrays.get("rs_after_test_acc"))
