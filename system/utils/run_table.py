"""A run's per-round series as a CSV next to its ``.h5``, for spreadsheets and pandas.

One row per round; the evaluation series (``rs_test_acc``, ``rs_val_acc``, ``rs_after_test_acc`` ...) fill
the rows of the rounds they were evaluated in (every ``-eg`` rounds) and are empty elsewhere, and so do
``-dlg``'s (``rs_dlg_psnr`` ..., every ``-dlgg`` rounds, at the rounds of ``rs_dlg_round``). Per-client
and per-layer tables (``rs_client_acc``, ``lag_*``) stay in the ``.h5``. The lines before the header start
with ``#`` and give the flags, the project's git revision and the torch build::

    pandas.read_csv("results/Digits_FedAvg_test_0.csv", comment="#")
"""
from __future__ import annotations

import csv
import io
import json
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Mapping

import numpy as np

from dataset.utils.atomic_io import atomic_path

REPO = Path(__file__).resolve().parents[2]


@lru_cache(maxsize=1)
def git_revision() -> str:
    """The project's commit, with ``-dirty`` when tracked files changed; ``unknown`` outside a git checkout."""
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=REPO,
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "unknown"


def csv_path(h5_path: Path) -> Path:
    return Path(h5_path).with_suffix(".csv")


def per_round_columns(arrays: Mapping[str, np.ndarray]) -> dict:
    """``{column: values by round}``: ``round``, then ``rs_round_time`` and every 1-D evaluation series
    placed at its evaluation rounds (NaN elsewhere), ``-dlg``'s at its attacked rounds."""
    rounds_done = len(arrays.get("rs_round_time", []))
    eval_rounds = np.asarray(arrays.get("rs_eval_round", []), dtype=int)
    dlg_rounds = np.asarray(arrays.get("rs_dlg_round", []), dtype=int)
    last = max([rounds_done - 1] + [int(r.max()) for r in (eval_rounds, dlg_rounds) if r.size])
    columns = {"round": np.arange(last + 1)}
    times = np.full(last + 1, np.nan)
    times[:rounds_done] = np.asarray(arrays.get("rs_round_time", []), dtype=float)
    columns["rs_round_time"] = times
    for name in sorted(arrays):
        values = np.asarray(arrays[name])
        if name in columns or values.ndim != 1 or values.dtype.kind not in "fiu" or name == "rs_eval_round":
            continue
        if len(values) == len(eval_rounds) and name.startswith(("rs_test", "rs_train", "rs_val", "rs_after")):
            column = np.full(last + 1, np.nan)
            column[eval_rounds] = values
            columns[name] = column
        elif name.startswith("rs_dlg_") and name != "rs_dlg_round" and len(values) == len(dlg_rounds):
            column = np.full(last + 1, np.nan)
            column[dlg_rounds] = values
            columns[name] = column
    return columns


def write_run_csv(h5_path: Path, arrays: Mapping[str, np.ndarray], attrs: Mapping[str, object]) -> Path:
    """Write the CSV of one run next to ``h5_path`` (atomically) and return its path."""
    columns = per_round_columns(arrays)
    text = io.StringIO()
    config = attrs.get("config", {})
    text.write(f"# config: {json.dumps(config, sort_keys=True, default=str)}\n")
    text.write(f"# git_revision: {attrs.get('git_revision') or git_revision()}\n")
    text.write(f"# torch: {config.get('torch_version', '?') if isinstance(config, dict) else '?'}\n")
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(list(columns))
    for row in zip(*columns.values()):
        writer.writerow(["" if isinstance(v, float) and np.isnan(v) else (int(v) if i == 0 else repr(float(v)))
                         for i, v in enumerate(row)])
    path = csv_path(h5_path)
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text.getvalue(), encoding="utf-8")
    return path
