"""Turn a folder of run files (``.h5``) into the paper-style table and figures::

    python system/report.py results/                      # writes results/report/
    python system/report.py results/ -o my-report --goal quick --heatmap-scale fraction
    python system/report.py results/ --include 'Digits-iid-lg4*'      # only the files whose name matches

Runs with the same (dataset, algorithm, goal) and the same settings (every flag the algorithm reads:
rounds, model, clients, ``--lag_share`` ...) are the seeds of one experiment; runs that differ in a setting
are other rows or columns, whose labels name it. Written to the output folder (default ``<first folder>/report``):

* ``table.md`` / ``table.csv``: the paper's Table 1 layout, rows = algorithms, columns = dataset x
  partition, one table per statistic: best (max over evaluations), final (last evaluation) and beside it
  the mean over clients there, the mean of the last k evaluations (``--last-k``) and beside it the same of
  the mean over clients, and at the final evaluation the mean accuracy of the worst 10% of clients and the
  std over clients; test accuracy in %, mean ± population std over seeds; the best mean of each column in
  bold. PFLlib's accuracy weighs each client by its test samples; the mean over clients counts each client
  once. ``summary.csv``: the same numbers, unrounded (fractions), one line per experiment, with run ids,
  model and its labels in the tables. Every statistic is recomputed from each run's arrays
  (``rs_test_acc``, ``rs_client_acc``), so runs written before the ``summary`` attribute existed are
  reported alike.
* ``curves_<dataset>.png``: accuracy against round, one line per algorithm, ± std over seeds shaded
  (and ``curves.png``, every dataset side by side, when there are several); a line that another holds
  point for point is dashed over it and named in the legend (``FedPer (= FedLAG, n=2)``).
* ``heatmap_<run>.png``: per-layer conflict score over rounds (layers x rounds, the paper's Fig. 2b),
  for the first seed of every experiment that recorded conflict scores (``--all-heatmaps``: every run).
* ``groups_<run>_<layer>.png``: with ``--lag_share groups``, each client's group over the rounds, a colour
  per group.
* ``personal_<experiment>.png``: the fraction of rounds each layer was kept personal.
* ``dlg_<dataset>.png``: for runs made with ``-dlg``, the PSNR of Deep Leakage from Gradients' reconstructions
  against the attacked round, one line per algorithm; the tables then hold the mean PSNR too.
* ``report.md``: all of the above on one page. A figure not drawn (a run's ``lag_groups`` that does not fit
  the run ...) is named there and printed, with why.

Only complete runs count (a diverged run is listed as left out) unless ``--include-incomplete``.
The partition of a dataset is read from ``<data_dir>/<dataset>/config.json`` (``data_dir`` as the run
recorded it, or ``--data_dir``), else from the name ``<Base>-<partition>`` (``MNIST-dir0.1``).
"""
from __future__ import annotations

import argparse
import csv
import io
import re
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

# An entry script: the project's packages are system/ (flcore, utils) and the root (dataset), unless
# installed with ``pip install -e .``. Library modules never touch sys.path.
for _folder in (Path(__file__).resolve().parent, Path(__file__).resolve().parents[1]):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

import numpy as np  # noqa: E402

from dataset.utils.atomic_io import write_text_atomically  # noqa: E402
from dataset.utils.one_line import OneLineParser  # noqa: E402
from flcore.flag_use import reads_lag_flags  # noqa: E402
from flcore.registry import lag_base  # noqa: E402
from reporting.grouping import Group, group_runs  # noqa: E402
from reporting.run_checks import groups_problem  # noqa: E402
from reporting.runs import Run, find_runs, load_runs  # noqa: E402
from reporting.statistics import recorded_last_k  # noqa: E402
from reporting.tables import (SUMMARY_FIELDS, csv_table, markdown_table, models_note,  # noqa: E402
                              not_available_note, personal_frequency, seeds_note, shown_statistics, summary_rows,
                              table_layout)
from utils.paths import display_path  # noqa: E402


def safe_name(text: str) -> str:
    """A file-name piece: letters, digits, '.', '+', '-' kept; anything else becomes '_'."""
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_") or "x"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description="Tables and plots from a folder of run .h5 files.",
                      formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                      help_command="python system/report.py --help")
    p.add_argument("folders", nargs="*", type=Path, metavar="FOLDER_OR_FILE",
                   help="folders holding .h5 runs, or .h5 files (default: results/)")
    p.add_argument("-o", "--out", type=Path, default=None,
                   help="output folder (default: <first folder, or the first file's folder>/report)")
    p.add_argument("--goal", action="append", default=None,
                   help="only runs with this goal (-go; run_all.sh's goal G also takes its runs G-<model>) "
                        "(repeatable)")
    p.add_argument("--include", action="append", default=[], metavar="GLOB",
                   help="only .h5 files whose name matches this shell pattern, e.g. 'Digits-*_FedLAG_*' "
                        "(repeatable: a file matching any is taken)")
    p.add_argument("--algorithm", action="append", default=None, help="only this algorithm (repeatable)")
    p.add_argument("--data_dir", type=Path, default=None,
                   help="where dataset folders (config.json) live (default: what each run recorded)")
    p.add_argument("--recursive", action="store_true", help="also read .h5 files in sub-folders")
    p.add_argument("--include-incomplete", action="store_true", help="count runs that stopped early")
    p.add_argument("--last-k", type=int, default=None, metavar="K",
                   help="the last-k table averages each run's last K evaluations (evaluations, not rounds: "
                        "one every -eg rounds) (default: the --report_last_k the runs recorded when they "
                        "agree, else 10)")
    p.add_argument("--heatmap-scale", choices=("count", "fraction"), default="count",
                   help="conflict colour: pairs in conflict, or that divided by C(uploads, 2)")
    p.add_argument("--all-heatmaps", action="store_true", help="a heatmap for every run, not every experiment")
    p.add_argument("--no-plots", action="store_true", help="tables only")
    p.add_argument("--title", default="Benchmark results", help="heading of report.md")
    return p


def write_csv(path: Path, rows: Sequence[Sequence[object]]) -> None:
    """``rows`` as CSV at ``path``, atomically (a failed write leaves the previous file whole)."""
    text = io.StringIO(newline="")
    csv.writer(text).writerows(rows)
    write_text_atomically(path, text.getvalue())


def uploads_text(uploads: np.ndarray) -> str:
    if len(uploads) == 0:
        return "?"
    low, high = int(np.min(uploads)), int(np.max(uploads))
    return f"{low}" if low == high else f"{low}-{high}"


def overview_panels(panels: Dict[str, Dict[str, object]], limit: int) -> Tuple[Dict[str, Dict[str, object]], str]:
    """The side-by-side overview's panels. More than ``limit`` algorithms (X and X+LAG counted once) would
    bury every line: then only the algorithms run on every dataset are kept (the note says so), and no
    overview is drawn when those are still too many or none (the note says why)."""
    def count(names) -> int:
        return len({lag_base(n) for n in names})

    names = [n for curves in panels.values() for n in curves]
    if count(names) <= limit:
        return panels, ""
    common = [n for n in dict.fromkeys(names) if all(n in curves for curves in panels.values())]
    if not common or count(common) > limit:  # the per-dataset figures (small multiples) carry it
        return {}, (f"{count(names)} algorithms, more than {limit} for one figure, and {count(common)} of them run "
                    f"on every dataset")
    return ({label: {n: curves[n] for n in common} for label, curves in panels.items()},
            ": the algorithms run on every dataset")


def figure_title(*lines: str) -> str:
    """``lines`` one under the other, each broken to fit the narrowest figure (labels that name settings are long)."""
    return "\n".join(textwrap.fill(line, 72) for line in lines)


def make_plots(groups: List[Group], out: Path, args, skipped: List[str]) -> Dict[str, List[Path]]:
    """Draw the report's figures into ``out``; returns them by kind. Each figure not drawn (a run's arrays
    that do not fit the run, an overview of too many algorithms) adds one line to ``skipped`` saying which and
    why, so that no figure is left out without a word."""
    from reporting import plots
    rows, columns, cells = table_layout(groups)
    written: Dict[str, List[Path]] = {"curves": [], "heatmaps": [], "groups": [], "personal": [], "dlg": []}
    panels = {}
    for column in columns:
        dlg = {r.label: cells[(r, column)].dlg_curve() for r in rows if (r, column) in cells}
        dlg = {label: curve for label, curve in dlg.items() if curve is not None}
        if dlg:
            path = out / f"dlg_{safe_name(column.dataset)}.png"
            plots.plot_dlg_psnr(dlg, figure_title(f"{column.label}: what the uploads revealed (DLG)",
                                                  "(PSNR of the reconstructions; mean ± std over seeds)"), path)
            written["dlg"].append(path)
        curves = {r.label: cells[(r, column)].curve() for r in rows if (r, column) in cells}
        models = sorted({cells[(r, column)].model for r in rows if (r, column) in cells})
        runs = sorted({len(cells[(r, column)].runs) for r in rows if (r, column) in cells})
        seeds = f"{runs[0]}" if len(runs) == 1 else f"{runs[0]}-{runs[-1]}"
        title = figure_title(f"{column.label}: test accuracy", f"(model {'/'.join(models)}; mean ± std over {seeds} "
                                                                  f"seed(s))")
        path = out / f"curves_{safe_name(column.dataset)}.png"
        plots.plot_accuracy_curves(curves, title, path)
        written["curves"].append(path)
        panels[column.label] = curves
    overview, note = overview_panels(panels, plots.PANEL_LIMIT)
    if len(overview) > 1:
        path = out / "curves.png"
        plots.plot_accuracy_overview(overview, f"Test accuracy per round (mean ± std over seeds){note}", path)
        written["curves"].insert(0, path)
    elif len(panels) > 1:
        skipped.append(f"curves.png (every dataset side by side): {note}; each curves_<dataset>.png shows its own")
    normalise = args.heatmap_scale == "fraction"
    labels = {id(g): f"{row.label} on {column.label}" for (row, column), g in cells.items()}
    # Groups of one (dataset, algorithm, goal) differ in settings: their files are told apart by their first run.
    experiments = Counter((g.dataset, g.algorithm, g.goal) for g in groups)
    for group in groups:
        with_scores = [r for r in group.runs if r.has_conflicts]
        label = labels[id(group)]
        if not with_scores:  # no heatmap; a group-sharing run without scores still says why it has no groups
            for run in group.runs if args.all_heatmaps else group.runs[:1]:
                written["groups"] += group_plots(run, label, out, skipped)
            continue
        for run in with_scores if args.all_heatmaps else with_scores[:1]:
            a = run.arrays
            uploads = np.asarray(a.get("lag_num_uploads", np.zeros(0)))
            if normalise and len(uploads) != len(a["lag_conflict_scores"]):
                skipped.append(f"heatmap of {run.path.name}: --heatmap-scale fraction needs lag_num_uploads, one "
                               f"per round, and the file has {len(uploads)} for {len(a['lag_conflict_scores'])} rounds")
            else:
                seed = run.config.get("seed", "?")
                title = figure_title(f"Per-layer conflict score: {label}",
                                     f"(run {run.run}, seed {seed}, {uploads_text(uploads)} clients scored per round, "
                                     f"ξ = {run.config.get('lag_xi', '?')}, K = {run.config.get('lag_top_k', '?')})")
                path = out / f"heatmap_{safe_name(run.path.stem)}.png"
                plots.plot_conflict_heatmap([str(n) for n in a["lag_layer_names"]], a["lag_conflict_scores"], title,
                                            path, personal=a.get("lag_personal"), uploads=uploads, normalise=normalise)
                written["heatmaps"].append(path)
            written["groups"] += group_plots(run, label, out, skipped)
        experiment = f"{group.dataset}_{group.algorithm}_{group.goal}"
        if experiments[(group.dataset, group.algorithm, group.goal)] > 1:
            experiment += f"_from_run{group.runs[0].run}"
        path = out / f"personal_{safe_name(experiment)}.png"
        layers, mean, std, averaged = personal_frequency(with_scores)
        if not averaged:
            skipped.append(f"{path.name}: no run of {label} recorded lag_personal")
            continue
        title = figure_title(f"How often each layer was personal: {label}",
                             f"(mean ± std over {averaged} run(s), K = {with_scores[0].config.get('lag_top_k', '?')})")
        plots.plot_personal_frequency(layers, mean, std, title, path)
        written["personal"].append(path)
    return written


def group_plots(run, label: str, out: Path, skipped: List[str]) -> List[Path]:
    """For a run with ``--lag_share groups``: each client's group over the rounds, one figure per layer that
    was ever personal (``lag_groups``). A ``lag_groups`` that does not fit the run, or a group-sharing run
    without one, adds a line to ``skipped`` instead."""
    from reporting import plots
    groups = run.arrays.get("lag_groups")
    if groups is None:
        if run.config.get("lag_share") == "groups" and reads_lag_flags(run.algorithm):
            skipped.append(f"groups of {run.path.name}: the run shared within groups but recorded no lag_groups")
        return []
    problem = groups_problem(run.arrays, run.config)
    if problem:
        skipped.append(f"groups of {run.path.name}: {problem}")
        return []
    paths = []
    for layer, name in enumerate(str(n) for n in run.arrays["lag_layer_names"]):
        if not (groups[:, layer] >= 0).any():
            continue  # never personal: shared by all in every round, no groups to draw
        path = out / f"groups_{safe_name(run.path.stem)}_{safe_name(name)}.png"
        title = figure_title(f"Clients sharing {name} within groups: {label}",
                             f"(run {run.run}, seed {run.config.get('seed', '?')})")
        plots.plot_client_groups(groups[:, layer], name, title, path)
        paths.append(path)
    if not paths:
        skipped.append(f"groups of {run.path.name}: no layer was personal in any round, so no groups to draw")
    return paths


def tables_markdown(groups: List[Group], last_k: Optional[int] = None) -> str:
    """One table per statistic (best, final, last-k mean, worst 10% of clients and std over clients at the
    final evaluation), each headed by what it shows, with how many seeds and which models they hold, and
    any settings that differ between runs averaged together (those between columns or rows are in their
    labels). ``last_k``: default :func:`~reporting.statistics.recorded_last_k` of the runs."""
    last_k = recorded_last_k([r for g in groups for r in g.runs], last_k)
    tables = [f"## {s.heading(last_k)}\n\n{markdown_table(groups, s.name, last_k=last_k)}\n\n"
              for s in shown_statistics(groups, last_k)]
    notes = " ".join(n for n in (seeds_note(groups), models_note(groups), not_available_note(groups, last_k)) if n)
    return "".join(tables) + f"{notes}\n"


def report_markdown(title: str, tables: str, left_out, written: Dict[str, List[Path]], out: Path,
                    skipped: Sequence[str] = ()) -> str:
    lines = [f"# {title}", "",
             "Test accuracy (%), mean ± std over seeds (population std; a value alone is a single run); "
             "best = max over evaluations, final = last evaluation, last-k = mean of each run's last k evaluations "
             "(an evaluation every -eg rounds): PFLlib's accuracy, over all test samples, so a client holding more "
             "of them weighs more; mean over clients = each client's accuracy counted once (rs_client_acc); "
             "worst 10% = mean accuracy of the ceil(n/10) lowest of the n clients at the final evaluation, client "
             "std = std over clients there. Bold: the best mean of each column (the lowest client std, and the "
             "lowest DLG PSNR where shown).", "", tables]
    if left_out:
        lines += ["## Runs left out", ""] + [f"- `{p.name}`: {why}" for p, why in left_out] + [""]
    if skipped:
        lines += ["## Figures not drawn", ""] + [f"- {line}" for line in skipped] + [""]
    sections = (("Accuracy curves", "curves"), ("Per-layer conflict heatmaps", "heatmaps"),
                ("Groups sharing a personal layer", "groups"), ("Personalisation frequency", "personal"),
                ("What the uploads revealed (DLG)", "dlg"))
    for heading, key in sections:
        if written.get(key):
            lines += [f"## {heading}", ""] + [f"![{p.stem}]({p.relative_to(out).as_posix()})" for p in written[key]]
            lines.append("")
    return "\n".join(lines)


def write_outputs(out: Path, groups: List[Group], last_k: int, tables: str, left_out, args,
                  skipped: List[str]) -> Dict[str, List[Path]]:
    """Write the report's files into ``out``, each atomically; returns the figures by kind, and adds a line to
    ``skipped`` for each figure not drawn."""
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomically(out / "table.md", tables)
    write_csv(out / "table.csv", csv_table(groups, last_k))
    records = summary_rows(groups, last_k)
    write_csv(out / "summary.csv", [list(SUMMARY_FIELDS)] + [[rec[k] for k in SUMMARY_FIELDS] for rec in records])
    written = {} if args.no_plots else make_plots(groups, out, args, skipped)
    write_text_atomically(out / "report.md", report_markdown(args.title, tables, left_out, written, out, skipped))
    return written


def selection_text(args) -> str:
    """`` matching GLOB, with goal G``: what the flags asked for, for the line saying nothing matched."""
    parts = [f"matching {' or '.join(args.include)}" if args.include else "",
             f"with goal {' or '.join(args.goal)}" if args.goal else "",
             f"of algorithm {' or '.join(args.algorithm)}" if args.algorithm else ""]
    return "".join(f" {part}" for part in parts if part)


def goal_counts(runs: Sequence[Run]) -> Dict[str, int]:
    """``{goal: runs}``, goals sorted."""
    counts: Dict[str, int] = {}
    for run in runs:
        counts[run.goal] = counts.get(run.goal, 0) + 1
    return dict(sorted(counts.items()))


def counts_text(counts: Dict[str, int]) -> str:
    return ", ".join(f"{goal} ({n} run{'s' if n != 1 else ''})" for goal, n in counts.items())


def goals_there(paths: Sequence[Path]) -> str:
    """`` (there: quick-CNN (8 runs), test (1 run))``: the goals of the complete runs in ``paths``."""
    counts = goal_counts(load_runs(paths)[0])
    return f" (there: {counts_text(counts)})" if counts else ""


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.last_k is not None and args.last_k < 1:
        parser.error(f"--last-k must be >= 1 (evaluations to average), got {args.last_k}")
    from utils.paths import RESULTS_DIR
    folders = args.folders or [RESULTS_DIR]
    missing = [f for f in folders if not f.is_dir() and not f.is_file()]
    if missing:
        print(f"error: no such folder or file: {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    out = args.out or (folders[0] if folders[0].is_dir() else folders[0].parent) / "report"
    paths = find_runs(folders, args.recursive, args.include)
    runs, left_out = load_runs(paths, goals=args.goal, include_incomplete=args.include_incomplete)
    if args.algorithm:
        runs = [r for r in runs if r.algorithm in args.algorithm]
    if not runs:
        print(f"error: no complete runs (.h5) in {', '.join(map(str, folders[:5]))}{selection_text(args)}"
              f"{goals_there(paths) if args.goal or args.algorithm else ''}", file=sys.stderr)
        for path, why in left_out:
            print(f"  left out {path.name}: {why}", file=sys.stderr)
        return 1
    groups = group_runs(runs, args.data_dir)
    last_k = recorded_last_k(runs, args.last_k)
    tables = tables_markdown(groups, last_k)
    skipped: List[str] = []
    try:
        written = write_outputs(out, groups, last_k, tables, left_out, args, skipped)
    except OSError as err:  # a full disk, a file-size limit, a folder that cannot be made
        print(f"error: cannot write the report in {display_path(out)} ({err.strerror or err}); each of its files "
              f"is complete, or as it was before", file=sys.stderr)
        return 2

    print(tables)
    for path, why in left_out:
        print(f"left out {path.name}: {why}")
    for line in skipped:
        print(f"figure not drawn: {line}")
    mixed = goal_counts(runs)
    if len(mixed) > 1:  # e.g. a test run beside a grid's: say so, and how to take one
        print(f"runs of {len(mixed)} goals: {counts_text(mixed)}; --goal NAME or --include GLOB takes some")
    count = 4 + sum(len(v) for v in written.values())
    print(f"{len(runs)} runs in {len(groups)} experiments -> {count} files in {display_path(out)} "
          f"(report.md, table.md, table.csv, summary.csv"
          + (f", {sum(len(v) for v in written.values())} PNG" if written else "") + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
