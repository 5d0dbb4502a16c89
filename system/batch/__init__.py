"""Batch runs: every combination of algorithms x datasets x partitions x models x seeds, each one run of
``system/main.py``. ``run_all.sh`` is a thin wrapper around :mod:`batch.cli`, and
``benchmarks/paper_comparison.py`` plans and runs its grids with the same modules.

One job per module: :mod:`~batch.usage` (the flags, and how a bad one is refused),
:mod:`~batch.command_line` and :mod:`~batch.grid_file` (reading them, with :mod:`~batch.values`),
:mod:`~batch.settings` (defaults < grid file < flags, checked), :mod:`~batch.partitions` (dataset folder
names and generator flags), :mod:`~batch.plan` (the runs), :mod:`~batch.run_states` (skip or rerun),
:mod:`~batch.datasets` (building missing folders), :mod:`~batch.executor` (``-j N`` runs at once),
:mod:`~batch.summary` and :mod:`~batch.logs` (what happened and why), :mod:`~batch.console` (progress
lines), :mod:`~batch.session` (all of it in order) and :mod:`~batch.cli` (the command).
"""
