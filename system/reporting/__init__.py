"""Batch reports: many run files (``.h5``) -> the paper's tables and figures (used by ``system/report.py``).

* :mod:`reporting.runs`: find and read run files (:class:`~reporting.runs.Run`).
* :mod:`reporting.run_checks`: what a run file must hold to be reported, and its ``lag_groups`` to be drawn.
* :mod:`reporting.grouping`: runs grouped into experiments (:class:`~reporting.grouping.Group`: the seeds of
  one dataset, algorithm, goal and settings), each with its dataset's partition, in the paper's order; the
  settings that tell columns and rows apart.
* :mod:`reporting.statistics`: what a table can show of each run (best, final, last-k mean, the mean over
  clients beside the last two, the worst 10% of clients and the std over clients at the final evaluation),
  and the k a report uses.
* :mod:`reporting.tables`: Table 1 (rows = algorithms, columns = dataset x partition; a cell is one
  group; a label names the settings it stands for) as Markdown and CSV, one table per statistic, with its
  notes and a per-group summary.
* :mod:`reporting.plots`: accuracy curves, conflict heatmaps, client groups and personal-layer frequencies.

Reading and writing one run's file is :mod:`utils.result_utils`; the training loop never imports this package.
"""
