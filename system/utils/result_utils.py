"""Run results on disk: one ``.h5`` per run, PFLlib's names, written atomically.

A file ``results/<dataset>_<algorithm>_<goal>_<run>.h5`` holds PFLlib's ``rs_test_acc``,
``rs_test_auc`` (PFLlib leaves it empty; here it is filled) and ``rs_train_loss`` (one entry per
evaluation), plus ``rs_eval_round`` (the round of each evaluation), ``rs_client_acc``
(evaluations x clients), ``rs_round_time`` (seconds per round) and whatever the algorithm records.
The run configuration is stored as JSON in the attribute ``config``, and the summary of its accuracy
(best, final, mean of the last k evaluations, the clients' spread at the final evaluation; see
:mod:`utils.accuracy_summary`) as JSON in the attribute ``summary``.

Only reading and writing single files lives here (the training loop imports it): the lock on a results
name is in :mod:`utils.run_lock`, which flags identify a run in :mod:`utils.run_identity`, and tables and
figures of many runs in the :mod:`reporting` package.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

import h5py
import numpy as np

from dataset.utils.atomic_io import atomic_path
from utils.paths import check_name


def result_path(folder: Path, dataset: str, algorithm: str, goal: str, run: int) -> Path:
    check_name(goal, "-go/--goal")  # a separator or '..' would write outside folder
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


def writable_problem(folder: Path) -> Optional[str]:
    """Why files cannot be written in ``folder`` (created if missing), or None when they can.

    Tries for real (a small file is written, synced and removed): permissions, a read-only or full file
    system and a path under a regular file all show up here rather than after training.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        return "it is a file, not a folder"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-test-")
        try:
            os.write(fd, b"\0" * 4096)
            os.fsync(fd)
        finally:
            os.close(fd)
            os.remove(probe)
    except OSError as err:
        return err.strerror or str(err)
    return None


def write_results_fallback(path: Path, arrays: Mapping[str, np.ndarray], attrs: Mapping[str, object]
                           ) -> Tuple[Optional[Path], List[str]]:
    """Write a run's results somewhere else when ``path`` cannot be written: the system's temporary
    folder, then the home folder. Returns (the file written or None, why each place failed)."""
    name = f"{Path(path).stem}-{os.getpid()}.h5"
    failures = []
    for folder in (Path(tempfile.gettempdir()) / "pfl-results", Path.home() / "pfl-results"):
        target = folder / name
        try:
            write_results(target, arrays, attrs)
            return target, failures
        except (OSError, RuntimeError) as err:  # h5py reports some write failures as RuntimeError
            failures.append(f"{target}: {err.strerror or err}")
    return None, failures


def read_results(path: Path) -> Tuple[Dict[str, np.ndarray], Dict[str, object]]:
    """All datasets and attributes of one run (dict and list attributes decoded from JSON), each dataset
    as an array (a scalar as a 0-d one). A group where a dataset belongs is refused (``ValueError``)."""
    with h5py.File(path, "r") as f:
        arrays = {}
        for name, item in f.items():
            if not isinstance(item, h5py.Dataset):
                raise ValueError(f"{name} is a group of other objects, not an array")
            arrays[name] = np.asarray(item[()])
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
