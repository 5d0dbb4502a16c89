"""The paper's Table 1 from groups of runs: layout, Markdown and CSV tables (one per statistic of
:mod:`reporting.statistics`), their notes, and summaries."""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np

from reporting.grouping import (Group, Partition, algorithm_sort_key, dataset_sort_key, flags_key, settings_text,
                                split_flags)
from reporting.runs import Run
from reporting.statistics import BY_NAME, OPTIONAL_STATISTICS, STATISTICS, Statistic
from utils.accuracy_summary import DEFAULT_LAST_K


@dataclass(frozen=True)
class Column:
    dataset: str
    partition: Partition
    label: str


@dataclass(frozen=True)
class Row:
    algorithm: str
    goal: str
    label: str


def table_layout(groups: Sequence[Group]) -> Tuple[List[Row], List[Column], Dict[Tuple[Row, Column], Group]]:
    """The paper's Table 1 layout: rows = algorithms, columns = dataset folders, ordered by partition then
    dataset (all Dir(0.1) columns first); a cell is one group.

    A label never stands for two settings (:func:`~reporting.grouping.split_flags`): a column names the
    flags its runs differ in from other columns' (``Digits Dir(0.1) (-gr 20)``), and two folders of one
    split that differ in nothing else are named by folder; a row is one algorithm and the values of the flags
    that tell its groups apart (``FedLAG (--lag_share groups)``, ``FedAvg (-gr 50)``), and its goal when some
    cell would hold two goals."""
    column_flags, row_flags = split_flags(groups)
    columns: Dict[str, Column] = {}
    for g in groups:
        if g.dataset not in columns:
            text = f"{g.partition.base} {g.partition.label}".strip() if g.partition.key else g.dataset
            detail = settings_text(g.settings, column_flags)
            columns[g.dataset] = Column(g.dataset, g.partition, f"{text} ({detail})" if detail else text)
    shared = Counter(c.label for c in columns.values())
    columns = {d: Column(d, c.partition, f"{c.label} [{d}]") if shared[c.label] > 1 else c
               for d, c in columns.items()}
    ordered_columns = sorted(columns.values(), key=lambda c: (c.partition.sort_key, dataset_sort_key(c.partition.base),
                                                               c.dataset))
    # One row per algorithm and settings when no cell would get two goals (e.g. goal "paper-DNN" on MNIST
    # and "paper-CNN" on CIFAR-10); otherwise one per (algorithm, goal, settings).
    cell_goals: Dict[Tuple[str, str], set] = {}
    for g in groups:
        cell_goals.setdefault((g.algorithm, g.dataset), set()).add(g.goal)
    merge = all(len(v) == 1 for v in cell_goals.values())
    rows: Dict[Tuple[str, str, str], Row] = {}
    cells: Dict[Tuple[Row, Column], Group] = {}
    for g in groups:
        goal = "" if merge else g.goal
        key = (g.algorithm, goal, flags_key(g, row_flags))
        if key not in rows:
            detail = "; ".join(p for p in (goal, settings_text(g.settings, row_flags)) if p)
            rows[key] = Row(g.algorithm, goal, f"{g.algorithm} ({detail})" if detail else g.algorithm)
        cells[(rows[key], columns[g.dataset])] = g
    ordered_rows = sorted(rows.values(), key=lambda r: (r.goal, algorithm_sort_key(r.algorithm), natural_key(r.label)))
    return ordered_rows, ordered_columns, cells


def natural_key(text: str) -> tuple:
    """Sorts ``-gr 5`` before ``-gr 50`` before ``-gr 100``: numbers in ``text`` compared as numbers."""
    return tuple((0, float(part), "") if i % 2 else (1, 0.0, part)
                 for i, part in enumerate(re.split(r"(\d+(?:\.\d+)?)", text)))


def group_labels(groups: Sequence[Group]) -> Dict[int, Tuple[str, str]]:
    """``id(group)`` -> (row label, column label) of its cell in :func:`table_layout`."""
    _, _, cells = table_layout(groups)
    return {id(g): (row.label, column.label) for (row, column), g in cells.items()}


def format_cell(mean: float, std: float, runs: int = 2, percent: bool = True) -> str:
    """Accuracy fractions as the paper prints them: percent, two decimals, ``mean ± std``; a single
    run has no spread, so its value stands alone (the seeds note gives the counts). ``n/a``: the runs
    did not record what the statistic needs (see :data:`NOT_AVAILABLE_NOTE`). ``percent=False``: a value
    in its own unit (the DLG PSNR in dB), two decimals likewise."""
    if np.isnan(mean):
        return "n/a"
    scale = 100 if percent else 1
    if runs == 1:
        return f"{scale * mean:.2f}"
    return f"{scale * mean:.2f} ± {scale * std:.2f}"


def markdown_table(groups: Sequence[Group], metric: str = "best", bold_best: bool = True,
                   last_k: int = DEFAULT_LAST_K) -> str:
    """One Markdown table (Table 1 layout) of the statistic ``metric`` (a name in
    :data:`~reporting.statistics.ALL_STATISTICS`: best, final, last_k, worst10, client_std ...), mean ± std in %
    (the DLG PSNR in dB).

    The best mean of each column is in bold (the highest; the lowest for client_std); a cell with no runs
    is "-", one whose runs lack the data is "n/a".
    """
    statistic = BY_NAME[metric]
    rows, columns, cells = table_layout(groups)
    header = "| method | " + " | ".join(c.label for c in columns) + " |"
    lines = [header, "|---|" + "---|" * len(columns)]
    stats = {key: g.stats(last_k) for key, g in cells.items()}
    top = {}
    for c in columns:
        means = [stats[(r, c)][f"{metric}_mean"] for r in rows if (r, c) in cells]
        means = [m for m in means if not np.isnan(m)]  # max() with a NaN depends on the order
        top[c] = (max(means) if statistic.higher_is_better else min(means)) if means else None
    for r in rows:
        out = []
        for c in columns:
            g = cells.get((r, c))
            if g is None:
                out.append("-")
                continue
            s = stats[(r, c)]
            text = format_cell(s[f"{metric}_mean"], s[f"{metric}_std"], len(g.runs), statistic.percent)
            out.append(f"**{text}**" if bold_best and len(rows) > 1 and s[f"{metric}_mean"] == top[c] else text)
        lines.append(f"| {r.label} | " + " | ".join(out) + " |")
    return "\n".join(lines)


NOT_AVAILABLE_NOTE = ("n/a: a run of the cell recorded no per-client accuracies at its final evaluation "
                      "(PFLlib's files; a Flower run whose evaluated clients changed).")


def not_available_note(groups: Sequence[Group], last_k: int = DEFAULT_LAST_K) -> str:
    """:data:`NOT_AVAILABLE_NOTE` when some cell shows n/a, else nothing."""
    missing = any(np.isnan(g.stats(last_k)[f"{s.name}_mean"]) for g in groups for s in STATISTICS)
    return NOT_AVAILABLE_NOTE if missing else ""


def seeds_note(groups: Sequence[Group]) -> str:
    """How many seeds each cell averages; a cell of one run shows its value alone (no ± spread)."""
    counts = sorted({len(g.runs) for g in groups})
    if counts == [1]:
        return "One seed per cell: each value is a single run (no ± spread)."
    if len(counts) == 1:
        return f"{counts[0]} seeds per cell (mean ± population std)."
    labels = group_labels(groups)
    detail = ", ".join(f"{labels[id(g)][0]} on {labels[id(g)][1]}: {len(g.runs)}" for g in groups
                       if len(g.runs) != counts[-1])
    return (f"Seeds per cell vary: most have {counts[-1]} (mean ± population std); {detail}"
            " (a value without ± is a single run).")


def models_note(groups: Sequence[Group]) -> str:
    """The one model of the table; or, when it mixes models, which (the labels name each cell's: runs of
    different models are never under one label)."""
    models = sorted({g.model for g in groups})
    if len(models) <= 1:
        return f"Model: {models[0] if models else '?'}."
    return f"Models: {', '.join(models)} (-m in each label)."


def shown_statistics(groups: Sequence[Group], last_k: int = DEFAULT_LAST_K) -> Tuple[Statistic, ...]:
    """The statistics a report shows: every standard one, and each optional one (``--val_ratio``,
    ``--eval_after_training``, ``-dlg``) that some cell has a value for."""
    stats = [g.stats(last_k) for g in groups]  # each recomputes every run's summary: once per group
    present = [s for s in OPTIONAL_STATISTICS if any(not np.isnan(g[f"{s.name}_mean"]) for g in stats)]
    return STATISTICS + tuple(present)


def csv_table(groups: Sequence[Group], last_k: int = DEFAULT_LAST_K) -> List[List[str]]:
    """Table 1 layout for a spreadsheet: one row per algorithm; per column one cell per statistic
    (best, final, final client mean, last-k mean, last-k client mean, final worst-10%, final client std, and
    the optional ones recorded)."""
    rows, columns, cells = table_layout(groups)
    statistics = shown_statistics(groups, last_k)
    header = ["method"] + [f"{c.label} {s.column_name(last_k)}" for c in columns for s in statistics]
    out = [header]
    for r in rows:
        line = [r.label]
        for c in columns:
            g = cells.get((r, c))
            if g is None:
                line += [""] * len(statistics)
            else:
                stats = g.stats(last_k)
                line += [format_cell(stats[f"{s.name}_mean"], stats[f"{s.name}_std"], len(g.runs), s.percent)
                         for s in statistics]
        out.append(line)
    return out


# A fixed column order, the first columns as they always were, so that a script reading them by position works.
SUMMARY_FIELDS = ("algorithm", "goal", "model", "dataset", "base_dataset", "partition", "runs", "run_ids",
                  "rounds", "best_mean", "best_std", "final_mean", "final_std", "last_k", "last_k_mean", "last_k_std",
                  "worst10_mean", "worst10_std", "client_std_mean", "client_std_std",
                  "final_client_mean_mean", "final_client_mean_std", "last_k_client_mean_mean",
                  "last_k_client_mean_std", "method", "column")


def summary_rows(groups: Sequence[Group], last_k: int = DEFAULT_LAST_K) -> List[Dict[str, object]]:
    """One record per group with the numbers (fractions in [0, 1], not rounded; NaN where the runs lack
    the data), for a tidy CSV. ``last_k`` is the k of the last_k_* fields; ``method`` and ``column`` are the
    group's labels in the tables (which tell apart groups of one algorithm, dataset and goal)."""
    records = []
    labels = group_labels(groups)
    for g in groups:
        method, column = labels[id(g)]
        records.append({"algorithm": g.algorithm, "goal": g.goal, "model": g.model, "dataset": g.dataset,
                        "base_dataset": g.partition.base, "partition": g.partition.key, "runs": len(g.runs),
                        "run_ids": " ".join(str(r.run) for r in g.runs),
                        "rounds": max(int(r.eval_rounds[-1]) for r in g.runs), "last_k": last_k,
                        "method": method, "column": column, **g.stats(last_k)})
    return records


def personal_frequency(runs: Sequence[Run]) -> Tuple[List[str], np.ndarray, np.ndarray, int]:
    """(layer names, mean, std over runs, runs averaged) of the fraction of rounds each layer was kept
    personal; a run that recorded no ``lag_personal`` (or other layers) is not averaged, and the count says so."""
    names = [str(n) for n in runs[0].arrays["lag_layer_names"]]
    freq = np.array([np.asarray(r.arrays["lag_personal"], dtype=float).mean(axis=0) for r in runs
                     if len(r.arrays.get("lag_personal", [])) and len(r.arrays["lag_layer_names"]) == len(names)])
    if freq.size == 0:
        return names, np.zeros(len(names)), np.zeros(len(names)), 0
    return names, freq.mean(axis=0), freq.std(axis=0), len(freq)
