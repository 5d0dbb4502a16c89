"""The settings of one batch: built-in defaults < grid file < flags, each checked before anything runs."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from utils.paths import REPO_ROOT

from grid.command_line import CommandLine
from grid.grid_file import GridFile, read_grid_file
from grid.partitions import generator_flags
from grid.usage import UsageError
from grid.values import list_items, words

DEFAULT_GRID = f"{REPO_ROOT}/benchmarks/grids/quick.grid"
# Used when neither the grid file nor a flag sets a value ("" : main.py's own default).
DEFAULTS = {"algorithms": "FedAvg FedLAG", "datasets": "Digits", "partitions": "dir0.1", "models": "CNN",
            "rounds": "20", "clients": "20", "join_ratio": "1.0", "device": "", "jobs": "1", "seeds": "0"}
LISTS = ("algorithms", "datasets", "partitions", "models", "seeds")


@dataclass
class Settings:
    algorithms: List[str]
    datasets: List[str]
    partitions: List[str]
    models: List[str]
    seeds: List[int]
    # Numbers stay as written: they are passed to main.py, and to folder names, unchanged.
    rounds: str
    clients: str
    join_ratio: str
    device: str
    goal: str
    jobs: int
    sources: List[Tuple[str, str]]     # (dataset, absolute file); the first entry of a dataset counts
    grid_flags: List[str]              # args: of the grid
    algorithm_flags: Dict[str, str]    # args.<ALGO>: of the grid
    main_flags: List[str]              # after "--" on the command line
    data_dir: str
    results_dir: str
    timeout: Optional[str]
    checkpoint: Optional[str]
    report: bool
    dry_run: bool

    @property
    def logs_dir(self) -> str:
        return f"{self.results_dir}/logs"

    def source_of(self, dataset: str) -> Optional[str]:
        """The offline source file of ``dataset``: a --source flag wins over the grid file's line."""
        return next((path for name, path in self.sources if name == dataset), None)


def resolve_settings(line: CommandLine) -> Settings:
    """Merge the flags with their grid file and the defaults; raises :class:`UsageError` on a bad value."""
    grid_path = line.grid
    if grid_path is None and os.path.isfile(DEFAULT_GRID):
        grid_path = DEFAULT_GRID
    grid = GridFile()
    if grid_path is not None:
        if not os.path.isfile(grid_path):
            raise UsageError(f"grid file {grid_path} not found")
        grid = read_grid_file(grid_path)

    def setting(key: str, default: Optional[str] = None) -> str:
        return line.grid_values.get(key) or grid.values.get(key) or (DEFAULTS[key] if default is None else default)

    grid_name = os.path.basename(grid_path or "batch")
    goal = setting("goal", grid_name.rsplit(".", 1)[0] if "." in grid_name else grid_name)
    seeds = seed_list(setting("seeds"))
    settings = Settings(
        algorithms=unique(list_items(setting("algorithms"))), datasets=unique(list_items(setting("datasets"))),
        partitions=unique(list_items(setting("partitions"))), models=unique(list_items(setting("models"))),
        seeds=unique(seeds), rounds=setting("rounds"), clients=setting("clients"),
        join_ratio=setting("join_ratio"), device=setting("device"), goal=goal,
        jobs=checked_jobs(line.jobs or setting("jobs")), sources=line.sources + grid.sources,
        grid_flags=grid.main_flags, algorithm_flags=grid.algorithm_flags, main_flags=line.main_flags,
        data_dir=line.data_dir, results_dir=line.results_dir, timeout=line.timeout,
        checkpoint=line.checkpoint, report=line.report, dry_run=line.dry_run)
    check(settings)
    return settings


def seed_list(text: str) -> List[int]:
    """"0 1 2", "0-4" or both; 007 and 7 are one seed."""
    seeds: List[int] = []
    for token in list_items(text):
        span = re.fullmatch(r"([0-9]+)-([0-9]+)", token)
        if span:
            seeds += range(int(span.group(1)), int(span.group(2)) + 1)
        elif re.fullmatch(r"[0-9]+", token):
            seeds.append(int(token))
        else:
            raise UsageError(f"seed '{token}' is not a number or a range like 0-4")
    return seeds


def unique(items: list) -> list:
    """Each item once, in the order of first appearance: a value listed twice (or a seed in two ranges)
    would run the same run twice, concurrently with -j."""
    return list(dict.fromkeys(items))


def checked_jobs(text: str) -> int:
    if not re.fullmatch(r"[1-9][0-9]*", text):
        raise UsageError(f"-j/--jobs must be a positive integer, got '{text}'")
    return int(text)


def check(settings: Settings) -> None:
    """Every value checked in one fixed order (rounds, clients, timeout, checkpoint, goal, lists,
    partitions); the first failing check is the one reported."""
    if not re.fullmatch(r"[0-9]+", settings.rounds):
        raise UsageError(f"rounds must be a non-negative integer, got '{settings.rounds}'")
    if not re.fullmatch(r"[1-9][0-9]*", settings.clients):
        raise UsageError(f"clients must be a positive integer, got '{settings.clients}'")
    if settings.timeout is not None and not re.fullmatch(r"[1-9][0-9]*", settings.timeout):
        raise UsageError("--timeout must be a whole number of seconds")
    if settings.checkpoint is not None and not re.fullmatch(r"[1-9][0-9]*", settings.checkpoint):
        raise UsageError("--checkpoint must be a positive number of rounds")
    if "_" in settings.goal or "/" in settings.goal:
        raise UsageError(f"goal '{settings.goal}' may not contain '_' or '/' (it is part of file names)")
    for name in LISTS:
        if not getattr(settings, name):
            raise UsageError(f"the grid has no {name}")
    for partition in settings.partitions:
        if partition != "-" and generator_flags(partition) is None:
            raise UsageError(f"unknown partition '{partition}' (dir<alpha>, exdir<alpha>, pat<k>, iid, any of them "
                             f"with -lg<groups>, or -)")


def algorithm_flags(settings: Settings, algorithm: str) -> List[str]:
    """args.<ALGO> flags for ``algorithm``: its base method's, then (for X+LAG) its own."""
    base = algorithm[:-len("+LAG")] if algorithm.endswith("+LAG") else algorithm
    flags = words(settings.algorithm_flags.get(base, ""))
    if base != algorithm:
        flags += words(settings.algorithm_flags.get(algorithm, ""))
    return flags
