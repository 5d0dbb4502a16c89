"""``python -m pfl_lag_bench {run,report,grid} [flags]``: the project's three commands (see the package)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence

import pfl_lag_bench  # noqa: F401 - puts the checkout's packages on sys.path

COMMANDS = {"run": "system/main.py: one federated run (PFLlib's flags)",
            "report": "system/report.py: tables and plots from .h5 files",
            "grid": "run_all.sh: a grid of runs (algorithms x datasets x partitions x seeds)"}


HELP = ("-h", "--help")


def program_name(invoked_as: str) -> str:
    """How the user called us: ``pfl-lag-bench`` (the installed command) or ``python -m pfl_lag_bench``."""
    return "pfl-lag-bench" if Path(invoked_as).name == "pfl-lag-bench" else "python -m pfl_lag_bench"


def usage(program: str) -> str:
    listing = "\n".join(f"  {name:7s} {what}" for name, what in COMMANDS.items())
    return (f"usage: {program} {{{','.join(COMMANDS)}}} [flags]\n{listing}\n"
            f"{program} COMMAND --help lists that command's flags")


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    program = program_name(sys.argv[0])
    if not argv or argv[0] in HELP:  # asked for: the usage is the answer, on stdout
        print(usage(program))
        return 0
    if argv[0] not in COMMANDS:
        print(f"{usage(program)}\nerror: unknown command {argv[0]!r}", file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "run":
        from main import main as run_main
        return run_main(rest)
    if command == "report":
        from report import main as report_main
        return report_main(rest)
    from grid.cli import main as grid_main
    return grid_main(rest)


if __name__ == "__main__":
    sys.exit(main())
