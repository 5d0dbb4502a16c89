"""Run results on disk: one ``.h5`` per run, PFLlib's names, written atomically.

A file ``results/<dataset>_<algorithm>_<goal>_<run>.h5`` holds PFLlib's ``rs_test_acc``,
``rs_test_auc`` (PFLlib leaves it empty; here it is filled) and ``rs_train_loss`` (one entry per
evaluation), plus ``rs_eval_round`` (the round of each evaluation), ``rs_client_acc``
(evaluations x clients), ``rs_round_time`` (seconds per round) and whatever the algorithm records.
The run configuration is stored as JSON in the attribute ``config``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Mapping, Tuple

import h5py
import numpy as np

from utils.paths import make_importable

make_importable()
from dataset.utils.atomic_io import atomic_path  # noqa: E402


def result_path(folder: Path, dataset: str, algorithm: str, goal: str, run: int) -> Path:
    return Path(folder) / f"{dataset}_{algorithm}_{goal}_{run}.h5"


def write_results(path: Path, arrays: Mapping[str, np.ndarray], attrs: Mapping[str, object]) -> None:
    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w") as f:
            for name, values in arrays.items():
                values = np.asarray(values)
                if values.dtype.kind == "U":
                    values = values.astype(h5py.string_dtype())
                f.create_dataset(name, data=values)
            for key, value in attrs.items():
                f.attrs[key] = json.dumps(value, default=str) if isinstance(value, (dict, list)) else value


def read_results(path: Path) -> Tuple[Dict[str, np.ndarray], Dict[str, object]]:
    """All datasets and attributes of one run (dict and list attributes decoded from JSON)."""
    with h5py.File(path, "r") as f:
        arrays = {name: f[name][()] for name in f.keys()}
        attrs = {k: _decode(v) for k, v in f.attrs.items()}
    for name, values in arrays.items():
        if values.dtype.kind == "O":
            arrays[name] = values.astype(str)
    return arrays, attrs


def _decode(value):
    if isinstance(value, str) and value[:1] in "{[":
        return json.loads(value)
    return value


def average_data(folder: Path, dataset: str, algorithm: str, goal: str, runs: List[int]) -> Tuple[float, float]:
    """Mean and std over ``runs`` of each run's best test accuracy (PFLlib's ``average_data``)."""
    best = [float(np.max(read_results(result_path(folder, dataset, algorithm, goal, r))[0]["rs_test_acc"]))
            for r in runs]
    return float(np.mean(best)), float(np.std(best))
