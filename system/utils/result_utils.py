"""Run results on disk: one ``.h5`` per run, PFLlib's names, written atomically.

A file ``results/<dataset>_<algorithm>_<goal>_<run>.h5`` holds PFLlib's ``rs_test_acc``,
``rs_test_auc`` (PFLlib leaves it empty; here it is filled) and ``rs_train_loss`` (one entry per
evaluation), plus ``rs_eval_round`` (the round of each evaluation), ``rs_client_acc``
(evaluations x clients), ``rs_round_time`` (seconds per round) and whatever the algorithm records.
The run configuration is stored as JSON in the attribute ``config``.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import h5py
import numpy as np

from dataset.utils.atomic_io import atomic_path
from flcore.registry import lag_base
from utils.errors import UserError
from utils.paths import DATASET_DIR, LOCATION_FLAGS, check_name, recorded_location


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


class RunLockedError(UserError, RuntimeError):
    """Another live process is writing results under the same name; the message names it."""


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


def lock_path(results_file: Path) -> Path:
    """The lock file of a results name: next to its ``.h5``, holding the owner's process id."""
    return Path(results_file).with_suffix(".lock")


class RunLock:
    """Exclusive use of a results name by this process, held until :meth:`release`.

    The lock is an ``flock`` on ``<name>.lock``, which the kernel drops when the process dies (even by
    SIGKILL), so a lock file left by a dead run is simply taken over. The file holds the owner's pid for
    the message a second run prints.
    """

    def __init__(self, results_file: Path):
        self.path = lock_path(results_file)
        self.fd: Optional[int] = None
        self.took_over: Optional[int] = None  # pid in a stale lock file that was taken over

    def acquire(self) -> "RunLock":
        import fcntl
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = _read_pid(fd)
                os.close(fd)
                raise RunLockedError(_locked_message(self.path, holder)) from None
            # The owner may have removed the file between our open and flock (and a third run made a new
            # one): a lock on a removed file protects nothing, so try again on the current file.
            try:
                current = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
            if current:
                break
            os.close(fd)
        self.took_over = _read_pid(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # removed while still held: no one can lock a dead file
        except OSError:
            pass  # the folder is gone or not writable any more; the lock ends with the descriptor anyway
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire() if self.fd is None else self

    def __exit__(self, *exc) -> None:
        self.release()


def check_unlocked(results_file: Path) -> None:
    """Raise :class:`RunLockedError` if a live process holds the lock of ``results_file`` (takes nothing)."""
    import fcntl
    path = lock_path(results_file)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        raise RunLockedError(_locked_message(path, _read_pid(fd))) from None
    finally:
        os.close(fd)


def _read_pid(fd: int) -> Optional[int]:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None


def _locked_message(path: Path, pid: Optional[int]) -> str:
    owner = f"process {pid}" if pid else "another process"
    return (f"{path.with_suffix('.h5').name} is being written by {owner} (lock {path}); wait for that run "
            f"to end, or give this one another -go/--goal or --results_dir")


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


# ----- batch reports: many runs -> tables and curves ---------------------------------------------------
# Used by ``system/report.py`` and ``run_all.sh``. A run is one ``.h5``; runs with the same
# (dataset, algorithm, goal) are seeds of one experiment; a table cell is one (algorithm, dataset) group.

RUN_NAME = re.compile(r"^(?P<dataset>.+)_(?P<algorithm>[^_]+)_(?P<goal>[^_]+)_(?P<run>\d+)$")
PARTITION_SUFFIX = re.compile(r"^(?P<base>.+)-(?P<partition>iid|(?:ex)?dir\d*\.?\d+(?:e-?\d+)?|pat\d+)$")
# Flags that say where and how a run executes, not what it computes: a resumed run may change them.
EXECUTION_FLAGS = frozenset({*LOCATION_FLAGS, "resume", "checkpoint_every", "device_id", "executor", "workers",
                             "ray_address", "gpus_per_worker", "ray_timeout", "threads"})
# Those, the device, and which seed (the file name says that): ignored when deciding whether a finished
# run was made with the flags asked for now.
NON_IDENTIFYING_FLAGS = EXECUTION_FLAGS | {"seed", "prev", "times", "device"}


@dataclass
class Run:
    """One run's file, with what the reports need from it (accuracies are fractions in [0, 1])."""
    path: Path
    dataset: str
    algorithm: str
    goal: str
    run: int
    complete: bool
    config: Dict[str, object]
    arrays: Dict[str, np.ndarray]

    @property
    def accuracy(self) -> np.ndarray:
        return np.asarray(self.arrays.get("rs_test_acc", np.zeros(0)), dtype=float)

    @property
    def eval_rounds(self) -> np.ndarray:
        """Round of each accuracy entry (``rs_eval_round``; for PFLlib's files, 0, eg, 2 eg, ...)."""
        rounds = self.arrays.get("rs_eval_round")
        if rounds is not None and len(rounds) == len(self.accuracy):
            return np.asarray(rounds, dtype=int)
        gap = int(self.config.get("eval_gap", 1) or 1)
        return np.arange(len(self.accuracy)) * gap

    @property
    def has_conflicts(self) -> bool:
        scores = self.arrays.get("lag_conflict_scores")
        return scores is not None and scores.ndim == 2 and scores.shape[0] > 0 and scores.shape[1] > 0


def load_run(path: Path) -> Run:
    """Read one run; names come from the file's attributes, or from its name for PFLlib's files.

    A file without the ``complete`` attribute (PFLlib writes results only at the end) counts as complete.
    """
    arrays, attrs = read_results(path)
    config = attrs.get("config") if isinstance(attrs.get("config"), dict) else {}
    parsed = RUN_NAME.match(Path(path).stem)
    guess = parsed.groupdict() if parsed else {"dataset": Path(path).stem, "algorithm": "?", "goal": "?", "run": 0}
    return Run(path=Path(path),
               dataset=str(attrs.get("dataset", config.get("dataset", guess["dataset"]))),
               algorithm=str(attrs.get("algorithm", config.get("algorithm", guess["algorithm"]))),
               goal=str(config.get("goal", guess["goal"])),
               run=int(attrs.get("run", guess["run"])),
               complete=bool(attrs.get("complete", True)),
               config=config, arrays=arrays)


def find_runs(places: Sequence[Path], recursive: bool = False) -> List[Path]:
    """The ``.h5`` files in folders ``places`` (sub-folders too with ``recursive``); files are taken as given."""
    pattern = "**/*.h5" if recursive else "*.h5"
    found = set()
    for place in map(Path, places):
        if place.is_file():
            found.add(place)
        else:
            found.update(p for p in place.glob(pattern) if not p.name.startswith("."))
    return sorted(found)


def load_runs(paths: Sequence[Path], goals: Optional[Sequence[str]] = None,
              include_incomplete: bool = False) -> Tuple[List[Run], List[Tuple[Path, str]]]:
    """(runs kept, [(path, why left out)]): unreadable files, incomplete runs, runs with no accuracy, and
    a second file for the same (dataset, algorithm, goal, run) (e.g. from two folders). Other goals are
    skipped silently."""
    kept, left_out = [], []
    seen: Dict[Tuple[str, str, str, int], Path] = {}
    for path in paths:
        try:
            run = load_run(path)
        except (OSError, ValueError, KeyError) as err:
            left_out.append((Path(path), f"unreadable: {err}"))
            continue
        if goals and run.goal not in goals:
            continue
        if not run.complete and not include_incomplete:
            left_out.append((Path(path), f"incomplete (stopped after {len(run.accuracy)} evaluations)"))
        elif len(run.accuracy) == 0:
            left_out.append((Path(path), "no accuracy recorded"))
        elif (run.dataset, run.algorithm, run.goal, run.run) in seen:
            first = seen[(run.dataset, run.algorithm, run.goal, run.run)]
            left_out.append((Path(path), f"same dataset, algorithm, goal and run index as {first}"))
        else:
            seen[(run.dataset, run.algorithm, run.goal, run.run)] = Path(path)
            kept.append(run)
    return kept, left_out


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


def partition_from_config(config: Mapping[str, object]) -> Tuple[str, str]:
    """(key, label) of a dataset ``config.json``: dir0.1 / Dir(0.1), pat2 / Pat(2), iid / IID."""
    scheme = str(config.get("partition", ""))
    if not config.get("non_iid", True) or scheme in ("iid", "-"):
        return "iid", "IID"
    if scheme in ("dir", "exdir"):
        alpha = f"{float(config.get('alpha', 0.1)):g}"
        return f"{scheme}{alpha}", f"{'Dir' if scheme == 'dir' else 'ExDir'}({alpha})"
    if scheme == "pat":
        k = int(config.get("class_per_client", 2))
        return f"pat{k}", f"Pat({k})"
    return scheme or "?", scheme or "?"


def partition_from_name(name: str) -> Tuple[str, str]:
    """(key, label) from the naming convention ``<Base>-<partition>`` (``MNIST-dir0.1``), else ("", "")."""
    match = PARTITION_SUFFIX.match(name)
    if not match:
        return "", ""
    token = match.group("partition")
    kind = re.match(r"[a-z]*", token).group(0)
    if kind == "iid":
        return "iid", "IID"
    # The same key and label as partition_from_config gives for that split (dir1.0 -> dir1, Dir(1)).
    number = f"{float(token[len(kind):]):g}" if kind != "pat" else str(int(token[len(kind):]))
    label = {"dir": f"Dir({number})", "exdir": f"ExDir({number})", "pat": f"Pat({number})"}[kind]
    return f"{kind}{number}", label


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
    """The runs (seeds) of one (dataset, algorithm, goal), and their summary."""
    dataset: str
    algorithm: str
    goal: str
    partition: Partition
    runs: List[Run] = field(default_factory=list)

    @property
    def best(self) -> np.ndarray:
        """Each run's best accuracy (PFLlib's headline number: max over evaluations)."""
        return np.array([float(np.max(r.accuracy)) for r in self.runs])

    @property
    def final(self) -> np.ndarray:
        """Each run's last evaluated accuracy."""
        return np.array([float(r.accuracy[-1]) for r in self.runs])

    def stats(self) -> Dict[str, float]:
        """Mean and population std (``np.std``, as PFLlib) over runs of the best and final accuracy."""
        best, final = self.best, self.final
        return {"best_mean": float(np.mean(best)), "best_std": float(np.std(best)),
                "final_mean": float(np.mean(final)), "final_std": float(np.std(final))}

    @property
    def model(self) -> str:
        models = sorted({str(r.config.get("model", "?")) for r in self.runs})
        return "/".join(models)

    def curve(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(rounds, mean, std, count) of the accuracy over the runs, aligned by evaluation round.

        Runs of different lengths (auto-break) contribute to the rounds they reached.
        """
        rounds = np.array(sorted({int(x) for r in self.runs for x in r.eval_rounds}), dtype=int)
        table = np.full((len(self.runs), len(rounds)), np.nan)
        column = {x: i for i, x in enumerate(rounds)}
        for row, run in enumerate(self.runs):
            for x, acc in zip(run.eval_rounds, run.accuracy):
                table[row, column[int(x)]] = acc
        count = np.sum(~np.isnan(table), axis=0)
        with np.errstate(invalid="ignore"):
            mean = np.nanmean(table, axis=0) if len(self.runs) else table[0]
            std = np.nanstd(table, axis=0)
        return rounds, mean, std, count


def group_runs(runs: Sequence[Run], data_dir: Optional[object] = None) -> List[Group]:
    """Runs grouped by (dataset, algorithm, goal), each group's runs in run-index order.

    ``data_dir`` overrides where dataset configs are looked up (default: each run's recorded ``data_dir``).
    """
    groups: Dict[Tuple[str, str, str], Group] = {}
    for run in runs:
        key = (run.dataset, run.algorithm, run.goal)
        if key not in groups:
            recorded = run.config.get("data_dir")
            where = data_dir if data_dir is not None else (recorded_location(recorded) if recorded else None)
            groups[key] = Group(run.dataset, run.algorithm, run.goal, dataset_partition(run.dataset, where))
        groups[key].runs.append(run)
    for group in groups.values():
        group.runs.sort(key=lambda r: r.run)
    return sorted(groups.values(), key=lambda g: (g.partition.sort_key, dataset_sort_key(g.partition.base),
                                                  g.dataset, algorithm_sort_key(g.algorithm), g.goal))


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


def common_settings(runs: Sequence[Run]) -> Dict[str, object]:
    """The flags that every run in ``runs`` recorded with the same value (execution flags left out)."""
    common: Optional[Dict[str, object]] = None
    for run in runs:
        mine = {k: v for k, v in run.config.items() if k not in NOT_SETTINGS}
        if common is None:
            common = mine
        else:
            common = {k: v for k, v in common.items() if k in mine and _value_key(mine[k]) == _value_key(v)}
    return common or {}


def differing_flags(settings: Sequence[Mapping[str, object]]) -> List[str]:
    """Flags that every mapping holds, with at least two different values among them (sorted)."""
    if len(settings) < 2:
        return []
    shared = set(settings[0]).intersection(*settings[1:])
    return sorted(k for k in shared if len({_value_key(s[k]) for s in settings}) > 1)


def flag_names() -> Dict[str, str]:
    """Config key -> the shortest command-line spelling (``local_learning_rate`` -> ``-lr``)."""
    from utils.options import build_parser
    names = {}
    for action in build_parser()._actions:
        if action.option_strings:
            names[action.dest] = min(action.option_strings, key=len)
    return names


def settings_text(settings: Mapping[str, object], keys: Sequence[str]) -> str:
    """``-lr 0.05, -gr 10``: the flags ``keys`` with their values in ``settings``."""
    names = flag_names()
    return ", ".join(f"{names.get(k, '--' + k)} {settings[k]}" for k in keys)


def varying_within(runs: Sequence[Run]) -> List[str]:
    """Flags whose value differs between runs that the table averages as seeds of one experiment."""
    configs = [{k: v for k, v in r.config.items() if k not in NOT_SETTINGS} for r in runs]
    keys = set().union(*configs) if configs else set()
    return sorted(k for k in keys if len({_value_key(c.get(k)) for c in configs}) > 1)


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
    run has no spread, so its value stands alone (the seeds note gives the counts)."""
    if runs == 1:
        return f"{100 * mean:.2f}"
    return f"{100 * mean:.2f} ± {100 * std:.2f}"


def markdown_table(groups: Sequence[Group], metric: str = "best", bold_best: bool = True) -> str:
    """One Markdown table (Table 1 layout) of ``metric`` ("best" or "final") accuracy, mean ± std in %.

    The highest mean of each column is in bold; a cell with no runs is "-".
    """
    rows, columns, cells = table_layout(groups)
    header = "| method | " + " | ".join(c.label for c in columns) + " |"
    lines = [header, "|---|" + "---|" * len(columns)]
    top = {}
    for c in columns:
        means = [cells[(r, c)].stats()[f"{metric}_mean"] for r in rows if (r, c) in cells]
        top[c] = max(means) if means else None
    for r in rows:
        out = []
        for c in columns:
            g = cells.get((r, c))
            if g is None:
                out.append("-")
                continue
            s = g.stats()
            text = format_cell(s[f"{metric}_mean"], s[f"{metric}_std"], len(g.runs))
            out.append(f"**{text}**" if bold_best and len(rows) > 1 and s[f"{metric}_mean"] == top[c] else text)
        lines.append(f"| {r.label} | " + " | ".join(out) + " |")
    return "\n".join(lines)


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


def csv_table(groups: Sequence[Group]) -> List[List[str]]:
    """Table 1 layout for a spreadsheet: one row per algorithm; per column a best and a final cell."""
    rows, columns, cells = table_layout(groups)
    header = ["method"] + [f"{c.label} {m}" for c in columns for m in ("best", "final")]
    out = [header]
    for r in rows:
        line = [r.label]
        for c in columns:
            g = cells.get((r, c))
            if g is None:
                line += ["", ""]
            else:
                s = g.stats()
                line += [format_cell(s["best_mean"], s["best_std"], len(g.runs)),
                         format_cell(s["final_mean"], s["final_std"], len(g.runs))]
        out.append(line)
    return out


SUMMARY_FIELDS = ("algorithm", "goal", "model", "dataset", "base_dataset", "partition", "runs", "run_ids",
                  "rounds", "best_mean", "best_std", "final_mean", "final_std")


def summary_rows(groups: Sequence[Group]) -> List[Dict[str, object]]:
    """One record per group with the numbers (fractions in [0, 1], not rounded), for a tidy CSV."""
    records = []
    for g in groups:
        s = g.stats()
        records.append({"algorithm": g.algorithm, "goal": g.goal, "model": g.model, "dataset": g.dataset,
                        "base_dataset": g.partition.base, "partition": g.partition.key, "runs": len(g.runs),
                        "run_ids": " ".join(str(r.run) for r in g.runs),
                        "rounds": max(int(r.eval_rounds[-1]) for r in g.runs), **s})
    return records


def personal_frequency(runs: Sequence[Run]) -> Tuple[List[str], np.ndarray, np.ndarray]:
    """(layer names, mean, std over runs) of the fraction of rounds each layer was kept personal."""
    names = [str(n) for n in runs[0].arrays["lag_layer_names"]]
    freq = np.array([np.asarray(r.arrays["lag_personal"], dtype=float).mean(axis=0) for r in runs
                     if len(r.arrays.get("lag_personal", [])) and len(r.arrays["lag_layer_names"]) == len(names)])
    if freq.size == 0:
        return names, np.zeros(len(names)), np.zeros(len(names))
    return names, freq.mean(axis=0), freq.std(axis=0)


def run_status(path: Path, argv: Sequence[str]) -> str:
    """What a batch should do about the run ``argv`` of ``system/main.py`` whose file is ``path``:

    ``missing`` (no file), ``incomplete`` (a run that stopped early, e.g. diverged), ``stale`` (complete,
    but made with other flags than ``argv``: rerun it) or ``complete`` (skip it). Flags in
    :data:`NON_IDENTIFYING_FLAGS` and values left open (``None``, resolved at run time) are not compared.
    """
    path = Path(path)
    if not path.is_file():
        return "missing"
    try:
        with h5py.File(path, "r") as f:
            complete = bool(f.attrs.get("complete", False))
            config = _decode(f.attrs.get("config", "{}"))
    except (OSError, ValueError):
        return "incomplete"
    if not complete:
        return "incomplete"
    from utils.options import build_parser
    try:
        wanted = vars(build_parser().parse_args(list(argv)))
    except SystemExit:
        return "missing"  # the run will fail again and say why
    if not isinstance(config, dict):
        return "stale"
    for key, value in wanted.items():
        if key in NON_IDENTIFYING_FLAGS or value is None or key not in config:
            continue
        if config[key] != value:
            return "stale"
    return "complete"
