"""Which statistics of a run the tables show, how each is captioned, and which k a report uses.

Every statistic is computed per run (:func:`run_values`: :func:`utils.accuracy_summary.summarize_accuracy`
and the mean over clients) and then averaged over the seeds of a cell (mean ± population std).

PFLlib's accuracy (``rs_test_acc``) is weighted by each client's test samples: where one client holds half of
them, it is mostly that client's accuracy. The mean over clients (each client's accuracy counted once, from
``rs_client_acc``) is shown beside it, at the final evaluation and over the last k.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, Mapping, Optional, Sequence

import numpy as np

from reporting.runs import Run
from utils.accuracy_summary import DEFAULT_LAST_K, final_client_accuracy


@dataclass(frozen=True)
class Statistic:
    name: str          # key prefix in Group.stats(): "<name>_mean", "<name>_std"
    run_field: str     # the field of run_values() it averages over seeds
    caption: str       # the table's heading; "{k}" is the last-k count
    column: str        # the CSV column suffix; "{k}" likewise
    higher_is_better: bool = True  # which end of a column is bold
    # Shown only when some run recorded it (the series of an optional flag such as --val_ratio).
    optional: bool = False
    # A fraction shown in % (the accuracies); False: a value shown as it is, in the unit its caption names.
    percent: bool = True

    def heading(self, last_k: int) -> str:
        return self.caption.format(k=last_k)

    def column_name(self, last_k: int) -> str:
        return self.column.format(k=last_k)


STATISTICS = (
    Statistic("best", "best", "Best accuracy (%): max over evaluations", "best"),
    Statistic("final", "final", "Final accuracy (%): last evaluation", "final"),
    Statistic("final_client_mean", "final_client_mean",
              "Final accuracy, mean over clients (%): each client's accuracy at the last evaluation, unweighted",
              "final client mean"),
    Statistic("last_k", "last_k_mean", "Mean accuracy of the last {k} evaluations (%)", "last-{k} mean"),
    Statistic("last_k_client_mean", "last_k_client_mean",
              "Mean over clients of the last {k} evaluations (%): each client's accuracy, unweighted",
              "last-{k} client mean"),
    Statistic("worst10", "final_worst10_mean",
              "Worst 10% of clients at the final evaluation (%): mean accuracy of the ceil(n/10) lowest clients",
              "final worst-10%"),
    Statistic("client_std", "final_client_std",
              "Std over clients of the final accuracy (percentage points; lower = more even)", "final client std",
              higher_is_better=False),
)
OPTIONAL_STATISTICS = (
    Statistic("at_best_val", "test_at_best_val",
              "Test accuracy at the best validation evaluation (%) (--val_ratio: the round is chosen on "
              "held-out train data, not on the test set)", "test at best val", optional=True),
    Statistic("after_final", "after_final",
              "Final accuracy after local training (%) (--eval_after_training: the last round's trained "
              "clients, after their local training)", "final after training", optional=True),
    Statistic("dlg_psnr", "dlg_psnr",
              "DLG mean PSNR (dB) (-dlg: how closely Deep Leakage from Gradients rebuilt clients' training images "
              "from their uploads, mean over every attacked image and round; lower = less revealed, bold: the lowest)",
              "DLG mean PSNR dB", higher_is_better=False, optional=True, percent=False),
)
ALL_STATISTICS = STATISTICS + OPTIONAL_STATISTICS
BY_NAME = {s.name: s for s in ALL_STATISTICS}


def recorded_last_k(runs: Sequence[Run], asked: Optional[int] = None) -> int:
    """The k of the last-k mean for a report: ``asked`` if given; else the ``--report_last_k`` of the runs
    that recorded one (runs from before the flag have no preference), when they all agree; else
    :data:`DEFAULT_LAST_K`. One k for the whole report, so that every cell averages alike."""
    if asked is not None:
        return asked
    recorded = {r.config["report_last_k"] for r in runs if "report_last_k" in r.config}
    if len(recorded) == 1:
        value = recorded.pop()
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return DEFAULT_LAST_K


def client_mean_series(arrays: Mapping[str, object]) -> Optional[np.ndarray]:
    """The unweighted mean of the clients' accuracies at each evaluation (one per entry of ``rs_test_acc``),
    from ``rs_client_acc`` (evaluations x clients); None where the run recorded no such table (the rule of
    :func:`~utils.accuracy_summary.final_client_accuracy`, so that it is n/a exactly where the client std is)."""
    if final_client_accuracy(arrays) is None:
        return None
    return np.asarray(arrays["rs_client_acc"], dtype=float).mean(axis=1)


def run_values(run: Run, last_k: int = DEFAULT_LAST_K) -> Dict[str, float]:
    """Every field a :class:`Statistic` reads of ``run``: its :class:`~utils.accuracy_summary.AccuracySummary`
    (``final_client_mean`` included) and ``last_k_client_mean``, the mean over clients averaged over the same
    last evaluations as ``last_k_mean``; NaN where the run has no per-client table."""
    summary = run.summary(last_k)
    means = client_mean_series(run.arrays)
    count = summary.last_k_count
    last_k_client_mean = float(np.mean(means[-count:])) if means is not None and count else float("nan")
    return {**asdict(summary), "last_k_client_mean": last_k_client_mean, "dlg_psnr": dlg_mean_psnr(run.arrays)}


def dlg_mean_psnr(arrays: Mapping[str, object]) -> float:
    """The mean of a ``-dlg`` run's ``rs_dlg_psnr`` over its evaluated rounds (each already a mean over the
    round's attacked images); NaN for a run made without ``-dlg`` (or whose rounds attacked nothing)."""
    values = np.asarray(arrays.get("rs_dlg_psnr", []), dtype=float)
    values = values[~np.isnan(values)]
    return float(values.mean()) if values.size else float("nan")
