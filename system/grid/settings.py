"""The settings of one batch: built-in defaults < grid file < flags, each value checked before anything runs."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from utils.paths import REPO_ROOT, check_name

from grid.command_line import CommandLine
from grid.grid_file import GridFile, read_grid_file
from grid.partitions import DEFAULT_CLIENTS
from grid.seeds import seed_count, seed_list, seed_range_problem, seed_spans
from grid.usage import UsageError
from grid.values import list_items, words

DEFAULT_GRID = f"{REPO_ROOT}/benchmarks/grids/quick.grid"
# Used when neither the grid file nor a flag sets a value ("" : main.py's own default).
DEFAULTS = {"algorithms": "FedAvg FedLAG", "datasets": "Digits", "partitions": "dir0.1", "models": "CNN",
            "rounds": "20", "clients": "20", "join_ratio": "1.0", "device": "", "jobs": "1", "seeds": "0"}
LISTS = ("algorithms", "datasets", "partitions", "models", "seeds")
# The lists whose values become parts of file names, by what one value is called in messages.
NAMED = (("algorithms", "algorithm"), ("datasets", "dataset"), ("models", "model"))
# Whole numbers as a grid writes them: -r; -j, -c, --timeout and --checkpoint.
WHOLE, POSITIVE = re.compile(r"[0-9]+"), re.compile(r"[1-9][0-9]*")
# The most runs one batch plans: far beyond any benchmark (the paper's Table 1 is a few hundred), and a
# bound on the lists, logs and result files that a slip such as -s 0-99999999 would make.
MAX_RUNS = 100_000


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
    # What is wrong with the values, every problem found (grid.checks adds main.py's): none may run.
    problems: List[str] = field(default_factory=list)

    @property
    def logs_dir(self) -> str:
        return f"{self.results_dir}/logs"

    def source_of(self, dataset: str) -> Optional[str]:
        """The offline source file of ``dataset``: a --source flag wins over the grid file's line."""
        return next((path for name, path in self.sources if name == dataset), None)


def resolve_settings(line: CommandLine) -> Settings:
    """Merge the flags with their grid file and the defaults. Raises :class:`UsageError` only for a grid
    file that cannot be read; every bad value is listed in ``problems`` (and :mod:`grid.checks` adds what
    needs main.py's own checks), so that one invocation names them all."""
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
    jobs = setting("jobs") if line.jobs is None else line.jobs
    settings = Settings(
        algorithms=unique(list_items(setting("algorithms"))), datasets=unique(list_items(setting("datasets"))),
        partitions=unique(list_items(setting("partitions"))), models=unique(list_items(setting("models"))),
        seeds=[], rounds=setting("rounds"), clients=setting("clients"),
        join_ratio=setting("join_ratio"), device=setting("device"), goal=goal,
        jobs=int(jobs) if POSITIVE.fullmatch(jobs) else 1, sources=line.sources + grid.sources,
        grid_flags=grid.main_flags, algorithm_flags=grid.algorithm_flags, main_flags=line.main_flags,
        data_dir=line.data_dir, results_dir=line.results_dir, timeout=line.timeout,
        checkpoint=line.checkpoint, report=line.report, dry_run=line.dry_run)
    if not POSITIVE.fullmatch(jobs):
        settings.problems.append(f"-j/--jobs must be a positive integer, got '{jobs}'")
    settings.problems += value_problems(settings)
    settings.seeds, seed_problems = read_seeds(setting("seeds"), settings)
    settings.problems += seed_problems
    return settings


def unique(items: list) -> list:
    """Each item once, in the order of first appearance: a value listed twice would run the same run twice,
    concurrently with -j."""
    return list(dict.fromkeys(items))


def read_seeds(text: str, settings: Settings) -> Tuple[List[int], List[str]]:
    """(the seeds of ``text``, its problems); no list when the runs would be too many to plan."""
    spans, problems = seed_spans(text)
    count = seed_count(spans)
    problems += [problem for problem in [seed_range_problem(spans)] if problem]
    if count == 0 and not problems:
        problems.append("the grid has no seeds")
    if run_count(settings, count) > MAX_RUNS:
        return [], problems + [runs_problem(settings, count)]
    return seed_list(spans), problems


def run_count(settings: Settings, seeds: int) -> int:
    """How many runs the lists make, at most (before equal run names are merged)."""
    return (len(settings.algorithms) * len(settings.datasets) * len(settings.partitions) * len(settings.models)
            * seeds)


def runs_problem(settings: Settings, seeds: int) -> str:
    sizes = [(len(getattr(settings, key)), key) for key in LISTS if key != "seeds"] + [(seeds, "seeds")]
    listed = " x ".join(f"{count:,} {key if count != 1 else key[:-1]}" for count, key in sizes)
    return (f"the grid makes {run_count(settings, seeds):,} runs ({listed}), more than the "
            f"{MAX_RUNS:,} one batch may hold; list fewer seeds (e.g. -s 0-4) or values")


def value_problems(settings: Settings) -> List[str]:
    """The numbers, the goal and the lists, in that order (each value of a list is :mod:`grid.checks`'s)."""
    problems = []
    if not WHOLE.fullmatch(settings.rounds):
        problems.append(f"rounds must be a non-negative integer, got '{settings.rounds}'")
    if not POSITIVE.fullmatch(settings.clients):
        problems.append(f"clients must be a positive integer, got '{settings.clients}'")
    if settings.timeout is not None and not POSITIVE.fullmatch(settings.timeout):
        problems.append("--timeout must be a whole number of seconds")
    if settings.checkpoint is not None and not POSITIVE.fullmatch(settings.checkpoint):
        problems.append("--checkpoint must be a positive number of rounds")
    try:
        if "_" in settings.goal or "/" in settings.goal:
            raise UsageError(f"goal '{settings.goal}' may not contain '_' or '/' (it is part of file names)")
        check_name(settings.goal, "goal", UsageError)
    except UsageError as err:
        problems.append(str(err))
    return problems + [f"the grid has no {name}" for name in LISTS if name != "seeds" and not getattr(settings, name)]


def checked_clients(settings: Settings) -> str:
    """``-c``, or where that is refused (and said so) the default: what the checks of other values assume."""
    return settings.clients if POSITIVE.fullmatch(settings.clients) else DEFAULT_CLIENTS


def algorithm_flags(settings: Settings, algorithm: str) -> List[str]:
    """args.<ALGO> flags for ``algorithm``: its base method's, then (for X+LAG) its own."""
    base = algorithm[:-len("+LAG")] if algorithm.endswith("+LAG") else algorithm
    flags = words(settings.algorithm_flags.get(base, ""))
    if base != algorithm:
        flags += words(settings.algorithm_flags.get(algorithm, ""))
    return flags
