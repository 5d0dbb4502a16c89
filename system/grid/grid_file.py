"""Reading a grid file: one ``key: values`` per line, ``#`` starts a comment (see ``--help``)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

from utils.paths import REPO_ROOT

from grid.usage import UsageError
from grid.values import absolute, words

# Keys holding one list or one value; a later line replaces an earlier one.
VALUE_KEYS = ("algorithms", "datasets", "partitions", "seeds", "models", "rounds", "clients", "join_ratio",
              "goal", "device", "jobs")
_BLANKS = " \t\n\r\f\v"
# "key: value" or "args.<ALGO>: value"; an ALGO name may hold '-' and '+' (LG-FedAvg, FedRep+LAG).
_LINE = re.compile(rf"^[{_BLANKS}]*([A-Za-z_][A-Za-z0-9_]*(?:\.[^{_BLANKS}:]+)?)[{_BLANKS}]*:(.*)$", re.DOTALL)


@dataclass
class GridFile:
    values: Dict[str, str] = field(default_factory=dict)
    sources: List[Tuple[str, str]] = field(default_factory=list)  # (dataset, absolute file), in order
    main_flags: List[str] = field(default_factory=list)           # args: for every run
    algorithm_flags: Dict[str, str] = field(default_factory=dict)  # args.<ALGO>: lines, joined


def read_grid_file(path: str) -> GridFile:
    """The grid file at ``path`` (absolute); raises :class:`UsageError` naming the line of a bad one."""
    grid = GridFile()
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for number, line in enumerate(lines, start=1):
        line = line.split("#", 1)[0]
        if not line.strip(_BLANKS):
            continue
        match = _LINE.match(line)
        if not match:
            raise UsageError(f"{path}:{number}: expected 'key: values', got '{line}'")
        key, value = match.group(1), match.group(2).strip(_BLANKS)
        if key in VALUE_KEYS:
            grid.values[key] = value
        elif key == "source":
            if "=" not in value:
                raise UsageError(f"{path}:{number}: source expects DATASET=FILE")
            dataset, _, file = value.partition("=")
            grid.sources.append((dataset, absolute(file, str(REPO_ROOT))))  # grids travel with the repository
        elif key == "args":
            grid.main_flags += words(value)
        elif key.startswith("args."):
            algorithm = key[len("args."):]
            grid.algorithm_flags[algorithm] = grid.algorithm_flags.get(algorithm, "") + " " + value
        else:
            raise UsageError(f"{path}:{number}: unknown key '{key}' (see --help)")
    return grid
