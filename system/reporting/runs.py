"""Runs on disk for the reports: find ``.h5`` files, read each into a :class:`Run`, keep the usable ones.

A run is one ``.h5``; runs with the same (dataset, algorithm, goal) and settings are seeds of one experiment
(:mod:`reporting.grouping`).
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from reporting.run_checks import run_file_problem
from utils.accuracy_summary import DEFAULT_LAST_K, AccuracySummary, summary_from_arrays
from utils.errors import first_line
from utils.result_utils import read_results

RUN_NAME = re.compile(r"^(?P<dataset>.+)_(?P<algorithm>[^_]+)_(?P<goal>[^_]+)_(?P<run>\d+)$")


class RunFileError(ValueError):
    """A run file the reports cannot use; the message says why."""


@dataclass
class Run:
    """One run's file, with what the reports need from it (accuracies are fractions in [0, 1])."""
    path: Path
    dataset: str
    algorithm: str
    goal: str
    run: int
    complete: bool
    config: Dict[str, object]
    arrays: Dict[str, np.ndarray]

    @property
    def accuracy(self) -> np.ndarray:
        return np.asarray(self.arrays.get("rs_test_acc", np.zeros(0)), dtype=float)

    @property
    def eval_rounds(self) -> np.ndarray:
        """Round of each accuracy entry (``rs_eval_round``; for PFLlib's files, 0, eg, 2 eg, ...)."""
        rounds = self.arrays.get("rs_eval_round")
        if rounds is not None and len(rounds) == len(self.accuracy):
            return np.asarray(rounds, dtype=int)
        gap = int(self.config.get("eval_gap", 1) or 1)
        return np.arange(len(self.accuracy)) * gap

    def summary(self, last_k: int = DEFAULT_LAST_K) -> AccuracySummary:
        """Best, final, last-k mean and the clients' final spread, recomputed from the arrays rather than read
        from the ``summary`` attribute: files from before it existed, and runs made with another
        ``--report_last_k``, are then reported with the same k and the same arithmetic as the rest."""
        return summary_from_arrays(self.arrays, last_k)

    @property
    def has_conflicts(self) -> bool:
        scores = self.arrays.get("lag_conflict_scores")
        return scores is not None and scores.ndim == 2 and scores.shape[0] > 0 and scores.shape[1] > 0


def load_run(path: Path) -> Run:
    """Read one run; names come from the file's attributes, or from its name for PFLlib's files.

    A file without the ``complete`` attribute (PFLlib writes results only at the end) counts as complete.
    Raises :class:`RunFileError` when the file does not hold what the reports read (:mod:`reporting.run_checks`).
    """
    try:
        arrays, attrs = read_results(path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RuntimeError) as err:  # anything h5py meets
        raise RunFileError(f"unreadable: {first_line(err)}") from None
    problem = run_file_problem(arrays, attrs)
    if problem:
        raise RunFileError(problem)
    config = attrs.get("config") if isinstance(attrs.get("config"), dict) else {}
    parsed = RUN_NAME.match(Path(path).stem)
    guess = parsed.groupdict() if parsed else {"dataset": Path(path).stem, "algorithm": "?", "goal": "?", "run": 0}
    return Run(path=Path(path),
               dataset=str(attrs.get("dataset", config.get("dataset", guess["dataset"]))),
               algorithm=str(attrs.get("algorithm", config.get("algorithm", guess["algorithm"]))),
               goal=str(config.get("goal", guess["goal"])),
               run=int(attrs.get("run", guess["run"])),
               complete=bool(attrs.get("complete", True)),
               config=config, arrays=arrays)


def find_runs(places: Sequence[Path], recursive: bool = False, include: Sequence[str] = ()) -> List[Path]:
    """The ``.h5`` files in folders ``places`` (sub-folders too with ``recursive``); files are taken as given.
    ``include``: shell patterns, of which a file's name must match one (``Digits-*_FedLAG_*``); none: all."""
    pattern = "**/*.h5" if recursive else "*.h5"
    found = set()
    for place in map(Path, places):
        if place.is_file():
            found.add(place)
        else:
            found.update(p for p in place.glob(pattern) if not p.name.startswith("."))
    if include:
        found = {p for p in found if any(fnmatch.fnmatchcase(p.name, glob) for glob in include)}
    return sorted(found)


def goal_wanted(run: Run, goals: Sequence[str]) -> bool:
    """Whether ``run``'s goal is one of ``goals``; ``run_all.sh`` writes goal G as ``G-<model>``
    (``quick-CNN``), so ``quick`` takes those runs too."""
    model = run.config.get("model")
    return any(run.goal == goal or (model is not None and run.goal == f"{goal}-{model}") for goal in goals)


def load_runs(paths: Sequence[Path], goals: Optional[Sequence[str]] = None,
              include_incomplete: bool = False) -> Tuple[List[Run], List[Tuple[Path, str]]]:
    """(runs kept, [(path, why left out)]): unreadable files and files that do not hold what the reports
    read, incomplete runs, runs with no accuracy, and a second file for the same (dataset, algorithm, goal,
    run) (e.g. from two folders). Other goals (a bad file's as its name gives it) are
    skipped silently."""
    kept, left_out = [], []
    seen: Dict[Tuple[str, str, str, int], Path] = {}
    for path in paths:
        try:
            run = load_run(path)
        except RunFileError as err:
            named = RUN_NAME.match(Path(path).stem)
            if not (goals and named and named.group("goal") not in goals):
                left_out.append((Path(path), str(err)))
            continue
        if goals and not goal_wanted(run, goals):
            continue
        if not run.complete and not include_incomplete:
            left_out.append((Path(path), f"incomplete (stopped after {len(run.accuracy)} evaluations)"))
        elif len(run.accuracy) == 0:
            left_out.append((Path(path), "no accuracy recorded"))
        elif (run.dataset, run.algorithm, run.goal, run.run) in seen:
            first = seen[(run.dataset, run.algorithm, run.goal, run.run)]
            left_out.append((Path(path), f"same dataset, algorithm, goal and run index as {first}"))
        else:
            seen[(run.dataset, run.algorithm, run.goal, run.run)] = Path(path)
            kept.append(run)
    return kept, left_out
