"""Runs grouped into experiments: a :class:`Group` is the seeds of one (dataset, algorithm, goal, settings),
with its dataset's :class:`Partition`, in the paper's order; and the settings runs share or differ in.

Runs that differ in any setting their algorithm reads (rounds, model, clients, ``--lag_share`` ...) are never
seeds of one experiment: averaging them would show one number for two experiments.
"""
from __future__ import annotations

import functools
import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from dataset.utils.naming import PARTITION_SUFFIX, partition_from_config, partition_from_name
from flcore.flag_use import unused_flags
from flcore.registry import lag_base
from reporting.runs import Run
from reporting.statistics import ALL_STATISTICS, run_values
from utils.accuracy_summary import DEFAULT_LAST_K
from utils.paths import DATASET_DIR, recorded_location
from utils.run_identity import NON_IDENTIFYING_FLAGS


@dataclass(frozen=True)
class Partition:
    """How a dataset folder was split: ``base`` (e.g. MNIST), ``key`` (e.g. dir0.1) and a display label."""
    base: str
    key: str
    label: str

    @property
    def sort_key(self) -> tuple:
        kind = re.match(r"[a-z]*", self.key).group(0)
        number = self.key[len(kind):]
        order = {"dir": 0, "exdir": 1, "pat": 2, "iid": 3}.get(kind, 4)
        try:
            value = float(number)
        except ValueError:
            value = 0.0
        return order, value, self.key


def dataset_partition(dataset: str, data_dir: Optional[object] = None) -> Partition:
    """The partition of dataset folder ``dataset``: read from ``<data_dir>/<dataset>/config.json``
    (``data_dir`` as the run recorded it; default ``dataset/``), else from the name ``<Base>-<partition>``."""
    key, label = partition_from_name(dataset)
    base = PARTITION_SUFFIX.match(dataset).group("base") if key else dataset
    config_file = Path(data_dir or DATASET_DIR) / dataset / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = None
    if isinstance(config, dict):
        key, label = partition_from_config(config)
        source = config.get("source")
        if source and dataset.startswith(str(source)):
            base = str(source)
    return Partition(base=base, key=key, label=label)


@dataclass
class Group:
    """The runs (seeds) of one (dataset, algorithm, goal, settings), and their summary. ``settings``: what
    :func:`run_settings` gives for each of its runs (the same for all of them)."""
    dataset: str
    algorithm: str
    goal: str
    partition: Partition
    runs: List[Run] = field(default_factory=list)
    settings: Dict[str, object] = field(default_factory=dict)

    @property
    def best(self) -> np.ndarray:
        """Each run's best accuracy (PFLlib's headline number: max over evaluations)."""
        return np.array([r.summary().best for r in self.runs])

    @property
    def final(self) -> np.ndarray:
        """Each run's last evaluated accuracy."""
        return np.array([r.summary().final for r in self.runs])

    def stats(self, last_k: int = DEFAULT_LAST_K) -> Dict[str, float]:
        """Mean and population std (``np.std``, as PFLlib) over runs of each statistic in
        :data:`~reporting.statistics.ALL_STATISTICS`: ``best_mean``, ``best_std``, ... ``client_std_std``,
        then the optional ones (``at_best_val_mean`` ...), NaN for runs made without their flag.

        A statistic some run could not compute (no per-client accuracies) is NaN for the group: a mean
        over only some of the seeds would not be comparable with the other cells.
        """
        per_run = [run_values(r, last_k) for r in self.runs]
        out = {}
        for statistic in ALL_STATISTICS:
            values = np.array([v[statistic.run_field] for v in per_run], dtype=float)
            out[f"{statistic.name}_mean"], out[f"{statistic.name}_std"] = float(np.mean(values)), float(np.std(values))
        return out

    @property
    def model(self) -> str:
        models = sorted({str(r.config.get("model", "?")) for r in self.runs})
        return "/".join(models)

    def curve(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(rounds, mean, std, count) of the accuracy over the runs, aligned by evaluation round.

        Runs of different lengths (auto-break) contribute to the rounds they reached.
        """
        return aligned_curve([(r.eval_rounds, r.accuracy) for r in self.runs])

    def dlg_curve(self) -> Optional[Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """(rounds, mean, std, count) of ``-dlg``'s PSNR over the runs that recorded it, aligned by attacked
        round (``rs_dlg_round``); None when none did."""
        series = [(np.asarray(r.arrays["rs_dlg_round"], dtype=int), np.asarray(r.arrays["rs_dlg_psnr"], dtype=float))
                  for r in self.runs if len(r.arrays.get("rs_dlg_psnr", [])) and
                  len(r.arrays.get("rs_dlg_round", [])) == len(r.arrays["rs_dlg_psnr"])]
        return aligned_curve(series) if series else None


def aligned_curve(series: Sequence[Tuple[np.ndarray, np.ndarray]]) -> Tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                              np.ndarray]:
    """(rounds, mean, std, count) over ``series`` of (rounds, values) pairs, one per run, aligned by round: a
    run contributes to the rounds it holds (a NaN value counts as missing)."""
    rounds = np.array(sorted({int(x) for xs, _ in series for x in xs}), dtype=int)
    table = np.full((len(series), len(rounds)), np.nan)
    column = {x: i for i, x in enumerate(rounds)}
    for row, (xs, values) in enumerate(series):
        for x, value in zip(xs, values):
            table[row, column[int(x)]] = value
    count = np.sum(~np.isnan(table), axis=0)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a round no run has a value for: NaN, said by its count
        mean = np.nanmean(table, axis=0) if len(series) else table[0]
        std = np.nanstd(table, axis=0)
    return rounds, mean, std, count


def group_runs(runs: Sequence[Run], data_dir: Optional[object] = None) -> List[Group]:
    """Runs grouped by (dataset, algorithm, goal, :func:`run_settings`), each group's runs in run-index order:
    only runs that differ in nothing but the seed (and how they were executed) are averaged together.

    ``data_dir`` overrides where dataset configs are looked up (default: each run's recorded ``data_dir``).
    """
    groups: Dict[Tuple[str, str, str, str], Group] = {}
    for run in runs:
        settings = run_settings(run)
        key = (run.dataset, run.algorithm, run.goal, _value_key(settings))
        if key not in groups:
            recorded = run.config.get("data_dir")
            where = data_dir if data_dir is not None else (recorded_location(recorded) if recorded else None)
            groups[key] = Group(run.dataset, run.algorithm, run.goal, dataset_partition(run.dataset, where),
                                settings=settings)
        groups[key].runs.append(run)
    for group in groups.values():
        group.runs.sort(key=lambda r: r.run)
    return sorted(groups.values(), key=lambda g: (g.partition.sort_key, dataset_sort_key(g.partition.base),
                                                  g.dataset, algorithm_sort_key(g.algorithm), g.goal,
                                                  g.runs[0].run))


# The paper's column order; other datasets follow alphabetically.
PAPER_DATASET_ORDER = ("MNIST", "Cifar10", "Cifar100", "EMNIST")


def dataset_sort_key(base: str) -> tuple:
    return (PAPER_DATASET_ORDER.index(base), "") if base in PAPER_DATASET_ORDER else (len(PAPER_DATASET_ORDER), base)


def algorithm_sort_key(name: str) -> tuple:
    """FedLAG first, then FedAvg, then the rest alphabetically; ``X+LAG`` right after ``X``."""
    base = lag_base(name)
    rank = {"FedLAG": 0, "FedAvg": 1}.get(base, 2)
    return rank, base.lower(), base != name


# Recorded in a run's config without being a setting of the experiment (or named by the table already).
NOT_SETTINGS = NON_IDENTIFYING_FLAGS | {"dataset", "algorithm", "goal", "torch_version", "intra_op_threads"}


def _value_key(value: object) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def run_settings(run: Run) -> Dict[str, object]:
    """The settings of ``run`` that could have changed its results: its recorded flags less execution
    flags and the flags its algorithm does not read (``--lag_warmup`` of a FedAvg run, ``-mu`` of FedLAG's)."""
    unused = unused_flags(run.algorithm, run.config)
    return {k: v for k, v in run.config.items() if k not in NOT_SETTINGS and k not in unused}


ABSENT = "(not recorded)"  # a flag a run's file does not record (made before the flag existed)


@functools.lru_cache(maxsize=1)
def flag_names() -> Dict[str, str]:
    """Config key -> the shortest command-line spelling (``local_learning_rate`` -> ``-lr``)."""
    from app.options import build_parser
    names = {}
    for action in build_parser()._actions:
        if action.option_strings:
            names[action.dest] = min(action.option_strings, key=len)
    return names


def settings_text(settings: Mapping[str, object], keys: Sequence[str]) -> str:
    """``-lr 0.05, -gr 10``: the flags ``keys`` that ``settings`` holds, with their values."""
    names = flag_names()
    return ", ".join(f"{names.get(k, '--' + k)} {settings[k]}" for k in keys if k in settings)


def flags_key(group: Group, keys: Sequence[str]) -> str:
    """The values of flags ``keys`` in ``group``'s settings (a flag it does not record counts as a value of its
    own), as a key: groups of one algorithm with the same key are one row of a table."""
    return _value_key({k: group.settings.get(k, ABSENT) for k in keys})


def _varies(groups: Sequence[Group], key: str, absent_counts: bool) -> bool:
    values = {_value_key(g.settings.get(key, ABSENT)) for g in groups if absent_counts or key in g.settings}
    return len(values) > 1


def _by(groups: Sequence[Group], attribute: str) -> List[List[Group]]:
    parts: Dict[str, List[Group]] = {}
    for g in groups:
        parts.setdefault(getattr(g, attribute), []).append(g)
    return list(parts.values())


def split_flags(groups: Sequence[Group]) -> Tuple[List[str], List[str]]:
    """(column flags, row flags): the settings in which ``groups`` differ, and where a table names them.

    A flag every group reads and that is the same within each dataset folder (``-gr`` of a grid whose datasets
    ran for different rounds) tells columns apart. Any other flag that differs, within a dataset folder
    (FedLAG at ``-gr 50`` beside FedAvg at ``-gr 100``) or between groups of one algorithm (``--lag_share``),
    tells rows apart. Both lists sorted.
    """
    keys = sorted({k for g in groups for k in g.settings})
    columns, rows = [], []
    for key in keys:
        everywhere = all(key in g.settings for g in groups)
        within_datasets = any(_varies(part, key, False) for part in _by(groups, "dataset"))
        if everywhere and not within_datasets:
            if _varies(groups, key, False):
                columns.append(key)
        elif within_datasets or any(_varies(part, key, True) for part in _by(groups, "algorithm")):
            rows.append(key)
    return columns, rows
