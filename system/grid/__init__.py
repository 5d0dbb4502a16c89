"""The grid runner: every combination of algorithms x datasets x partitions x models x seeds, each one
run of ``system/main.py``. ``run_all.sh`` is a thin wrapper around :mod:`grid.cli`, and
``benchmarks/paper_comparison.py`` plans and runs its grids with the same modules.

One job per module: :mod:`~grid.usage` (the flags, and how a bad one is refused),
:mod:`~grid.command_line` and :mod:`~grid.grid_file` (reading them, with :mod:`~grid.values`),
:mod:`~grid.settings` (defaults < grid file < flags, each value checked), :mod:`~grid.seeds` (seed ranges,
counted before they are listed), :mod:`~grid.partitions` (dataset folder names and generator flags),
:mod:`~grid.plan` (the runs), :mod:`~grid.checks` (every problem of the grid, main.py's own checks of its
commands included, before the first run), :mod:`~grid.run_states` (skip or rerun),
:mod:`~grid.datasets` (building missing folders), :mod:`~grid.launcher` (starting the runs'
``system/main.py`` processes, ``-j N`` at once, and stopping them), :mod:`~grid.summary` and
:mod:`~grid.logs` (what happened and why), :mod:`~grid.console` (progress lines), :mod:`~grid.session`
(all of it in order) and :mod:`~grid.cli` (the command).
"""
