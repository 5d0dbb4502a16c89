"""Reading ``run_all.sh``'s flags (see :data:`grid.usage.USAGE`).

Parsed by hand rather than with argparse on purpose: the word after a flag is its value whatever it
looks like (``-g --dry-run`` names a grid file), a flag is only ever its whole name (no abbreviation, no
``--flag=value``), and ``-h`` stops the reading before anything after it is looked at. A command thus
means exactly the words it spells, and a word that is not a flag is refused rather than guessed at.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from utils.paths import REPO_ROOT

from grid.usage import UsageError
from grid.values import absolute, current_dir

# Flags that set a grid value (overriding the grid file), by the grid key they set.
GRID_FLAGS = {
    "-a": "algorithms", "--algorithms": "algorithms",
    "-d": "datasets", "--datasets": "datasets",
    "-p": "partitions", "--partitions": "partitions",
    "-s": "seeds", "--seeds": "seeds",
    "-m": "models", "--models": "models",
    "-r": "rounds", "--rounds": "rounds",
    "-c": "clients", "--clients": "clients",
    "--jr": "join_ratio", "--join_ratio": "join_ratio",
    "--goal": "goal",
    "--device": "device",
}
# Flags with a value that are not grid values, by the CommandLine field they set.
BATCH_FLAGS = {
    "-g": "grid", "--grid": "grid",
    "-j": "jobs", "--jobs": "jobs",
    "--data_dir": "data_dir",
    "--results_dir": "results_dir",
    "--timeout": "timeout",
    "--checkpoint": "checkpoint",
    "--source": "source",
}
# Values that are paths, made absolute against the working directory.
PATH_FIELDS = ("grid", "data_dir", "results_dir")


@dataclass
class CommandLine:
    """What the flags said; ``None`` where a flag was not given."""
    grid_values: Dict[str, str] = field(default_factory=dict)
    sources: List[Tuple[str, str]] = field(default_factory=list)  # (dataset, absolute file), in order
    grid: Optional[str] = None
    jobs: Optional[str] = None
    data_dir: str = f"{REPO_ROOT}/dataset"
    results_dir: str = f"{REPO_ROOT}/results"
    timeout: Optional[str] = None
    checkpoint: Optional[str] = None
    report: bool = False
    dry_run: bool = False
    show_help: bool = False
    main_flags: List[str] = field(default_factory=list)  # after "--": for every run of main.py


def parse_command_line(argv: Sequence[str]) -> CommandLine:
    """The flags of ``argv``; raises :class:`UsageError` on an unknown flag or a missing value."""
    line = CommandLine()
    cwd = current_dir()
    args = list(argv)
    i = 0
    while i < len(args):
        flag = args[i]
        if flag in ("-h", "--help"):
            line.show_help = True
            return line
        if flag == "--":
            line.main_flags = args[i + 1:]
            return line
        if flag == "--report":
            line.report = True
        elif flag == "--dry-run":
            line.dry_run = True
        elif flag in GRID_FLAGS or flag in BATCH_FLAGS:
            if i + 1 >= len(args) or not args[i + 1]:
                raise UsageError(f"{flag} needs a value (see --help)")
            value = args[i + 1]
            i += 1
            if flag in GRID_FLAGS:
                line.grid_values[GRID_FLAGS[flag]] = value
            elif BATCH_FLAGS[flag] == "source":
                line.sources.append(source_entry(value, cwd))
            elif BATCH_FLAGS[flag] in PATH_FIELDS:
                setattr(line, BATCH_FLAGS[flag], absolute(value, cwd))
            else:
                setattr(line, BATCH_FLAGS[flag], value)
        else:
            raise UsageError(f"unknown option '{flag}' (flags for main.py go after --; see --help)")
        i += 1
    return line


def source_entry(value: str, cwd: str) -> Tuple[str, str]:
    if "=" not in value:
        raise UsageError(f"--source expects DATASET=FILE, got '{value}'")
    dataset, _, path = value.partition("=")
    return dataset, absolute(path, cwd)
