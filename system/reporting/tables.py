"""The paper's Table 1 from groups of runs: layout, Markdown and CSV tables (one per statistic of
:mod:`reporting.statistics`), their notes, and summaries."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np

from reporting.grouping import (Group, Partition, algorithm_sort_key, common_settings, dataset_sort_key,
                                differing_flags, flag_names, settings_text, varying_within)
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
    """The paper's Table 1 layout: rows = algorithms (with the goal when there are several goals),
    columns = dataset x partition, ordered by partition then dataset (all Dir(0.1) columns first)."""
    goals = sorted({g.goal for g in groups})
    columns: Dict[str, Column] = {}
    labels: Dict[str, List[str]] = {}
    texts = {g.dataset: f"{g.partition.base} {g.partition.label}".strip() if g.partition.key else g.dataset
             for g in groups}
    for dataset, text in texts.items():
        labels.setdefault(text, []).append(dataset)
    # Settings each column's runs share; columns of one base dataset that differ in some flag say which.
    column_settings = {d: common_settings([r for g in groups if g.dataset == d for r in g.runs]) for d in texts}
    by_base: Dict[str, List[str]] = {}
    for g in groups:
        if g.dataset not in by_base.setdefault(g.partition.base, []):
            by_base[g.partition.base].append(g.dataset)
    column_flags = {g.dataset: differing_flags([column_settings[d] for d in by_base[g.partition.base]])
                    for g in groups}
    for g in groups:
        if g.dataset in columns:
            continue
        text = texts[g.dataset]
        flags = column_flags[g.dataset]
        if flags:
            text = f"{text} ({settings_text(column_settings[g.dataset], flags)})"
        if len(labels[texts[g.dataset]]) > 1 and not flags:  # same base and split, nothing else differs
            text = f"{text} [{g.dataset}]"
        columns[g.dataset] = Column(g.dataset, g.partition, text)
    ordered_columns = sorted(columns.values(), key=lambda c: (c.partition.sort_key, dataset_sort_key(c.partition.base),
                                                               c.dataset))
    # One row per algorithm when no cell would get two goals (e.g. goal "paper-DNN" on MNIST and
    # "paper-CNN" on CIFAR-10); otherwise one row per (algorithm, goal).
    cell_goals: Dict[Tuple[str, str], set] = {}
    for g in groups:
        cell_goals.setdefault((g.algorithm, g.dataset), set()).add(g.goal)
    merge = all(len(v) == 1 for v in cell_goals.values())
    # Rows of one algorithm split by goal name the flags that differ between them.
    row_settings = {key: common_settings([r for g in groups if (g.algorithm, "" if merge else g.goal) == key
                                          for r in g.runs])
                    for key in {(g.algorithm, "" if merge else g.goal) for g in groups}}
    rows: Dict[Tuple[str, str], Row] = {}
    for g in groups:
        key = (g.algorithm, "" if merge else g.goal)
        label = g.algorithm if merge or len(goals) == 1 else f"{g.algorithm} ({g.goal})"
        siblings = [s for k, s in row_settings.items() if k[0] == g.algorithm]
        flags = differing_flags(siblings)
        if flags:
            detail = settings_text(row_settings[key], flags)
            label = f"{label[:-1]}; {detail})" if label.endswith(")") else f"{label} ({detail})"
        rows.setdefault(key, Row(g.algorithm, key[1], label))
    ordered_rows = sorted(rows.values(), key=lambda r: (r.goal, algorithm_sort_key(r.algorithm)))
    cells = {(rows[(g.algorithm, "" if merge else g.goal)], columns[g.dataset]): g for g in groups}
    return ordered_rows, ordered_columns, cells


def format_cell(mean: float, std: float, runs: int = 2) -> str:
    """Accuracy fractions as the paper prints them: percent, two decimals, ``mean ± std``; a single
    run has no spread, so its value stands alone (the seeds note gives the counts). ``n/a``: the runs
    did not record what the statistic needs (see :data:`NOT_AVAILABLE_NOTE`)."""
    if np.isnan(mean):
        return "n/a"
    if runs == 1:
        return f"{100 * mean:.2f}"
    return f"{100 * mean:.2f} ± {100 * std:.2f}"


def markdown_table(groups: Sequence[Group], metric: str = "best", bold_best: bool = True,
                   last_k: int = DEFAULT_LAST_K) -> str:
    """One Markdown table (Table 1 layout) of the statistic ``metric`` (a name in
    :data:`~reporting.statistics.STATISTICS`: best, final, last_k, worst10, client_std), mean ± std in %.

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
            text = format_cell(s[f"{metric}_mean"], s[f"{metric}_std"], len(g.runs))
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
    detail = ", ".join(f"{g.algorithm} on {g.dataset}: {len(g.runs)}" for g in groups if len(g.runs) != counts[-1])
    return (f"Seeds per cell vary: most have {counts[-1]} (mean ± population std); {detail}"
            " (a value without ± is a single run).")


def settings_note(groups: Sequence[Group]) -> str:
    """Flags that differ between the runs a cell averages (they were run as seeds of one experiment)."""
    parts = []
    for g in groups:
        flags = varying_within(g.runs)
        if flags:
            names = flag_names()
            values = "; ".join(f"{names.get(k, '--' + k)} " + ", ".join(dict.fromkeys(str(r.config.get(k))
                                                                         for r in g.runs)) for k in flags)
            parts.append(f"{g.algorithm} on {g.dataset} ({g.goal}): {values}")
    return ("Averaged runs that differ in settings: " + " | ".join(parts) + ".") if parts else ""


def models_note(groups: Sequence[Group]) -> str:
    """Which model each column used, when the table mixes models; else the one model."""
    _, columns, cells = table_layout(groups)
    per_column = {c.label: sorted({g.model for (r, col), g in cells.items() if col == c}) for c in columns}
    models = sorted({m for v in per_column.values() for m in v})
    if len(models) <= 1:
        return f"Model: {models[0] if models else '?'}."
    return "Models: " + "; ".join(f"{label}: {'/'.join(m)}" for label, m in per_column.items()) + "."


def shown_statistics(groups: Sequence[Group], last_k: int = DEFAULT_LAST_K) -> Tuple[Statistic, ...]:
    """The statistics a report shows: every standard one, and each optional one (``--val_ratio``,
    ``--eval_after_training``) that some cell has a value for."""
    stats = [g.stats(last_k) for g in groups]  # each recomputes every run's summary: once per group
    present = [s for s in OPTIONAL_STATISTICS if any(not np.isnan(g[f"{s.name}_mean"]) for g in stats)]
    return STATISTICS + tuple(present)


def csv_table(groups: Sequence[Group], last_k: int = DEFAULT_LAST_K) -> List[List[str]]:
    """Table 1 layout for a spreadsheet: one row per algorithm; per column one cell per statistic
    (best, final, last-k mean, final worst-10%, final client std, and the optional ones recorded)."""
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
                line += [format_cell(stats[f"{s.name}_mean"], stats[f"{s.name}_std"], len(g.runs))
                         for s in statistics]
        out.append(line)
    return out


# A fixed column order, the first columns as they always were, so that a script reading them by position works.
SUMMARY_FIELDS = ("algorithm", "goal", "model", "dataset", "base_dataset", "partition", "runs", "run_ids",
                  "rounds", "best_mean", "best_std", "final_mean", "final_std", "last_k", "last_k_mean", "last_k_std",
                  "worst10_mean", "worst10_std", "client_std_mean", "client_std_std")


def summary_rows(groups: Sequence[Group], last_k: int = DEFAULT_LAST_K) -> List[Dict[str, object]]:
    """One record per group with the numbers (fractions in [0, 1], not rounded; NaN where the runs lack
    the data), for a tidy CSV. ``last_k`` is the k of the last_k_* fields."""
    records = []
    for g in groups:
        records.append({"algorithm": g.algorithm, "goal": g.goal, "model": g.model, "dataset": g.dataset,
                        "base_dataset": g.partition.base, "partition": g.partition.key, "runs": len(g.runs),
                        "run_ids": " ".join(str(r.run) for r in g.runs),
                        "rounds": max(int(r.eval_rounds[-1]) for r in g.runs), "last_k": last_k,
                        **g.stats(last_k)})
    return records


def personal_frequency(runs: Sequence[Run]) -> Tuple[List[str], np.ndarray, np.ndarray]:
    """(layer names, mean, std over runs) of the fraction of rounds each layer was kept personal."""
    names = [str(n) for n in runs[0].arrays["lag_layer_names"]]
    freq = np.array([np.asarray(r.arrays["lag_personal"], dtype=float).mean(axis=0) for r in runs
                     if len(r.arrays.get("lag_personal", [])) and len(r.arrays["lag_layer_names"]) == len(names)])
    if freq.size == 0:
        return names, np.zeros(len(names)), np.zeros(len(names))
    return names, freq.mean(axis=0), freq.std(axis=0)
