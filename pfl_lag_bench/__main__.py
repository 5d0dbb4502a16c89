"""``python -m pfl_lag_bench {run,report,grid} [flags]``: the project's three commands (see the package)."""
from __future__ import annotations

import sys
from typing import Optional, Sequence

import pfl_lag_bench  # noqa: F401 - puts the checkout's packages on sys.path

COMMANDS = {"run": "system/main.py: one federated run (PFLlib's flags)",
            "report": "system/report.py: tables and plots from .h5 files",
            "grid": "run_all.sh: a grid of runs (algorithms x datasets x partitions x seeds)"}


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        listing = "\n".join(f"  {name:7s} {what}" for name, what in COMMANDS.items())
        print(f"usage: python -m pfl_lag_bench {{{','.join(COMMANDS)}}} [flags]\n{listing}",
              file=sys.stderr if argv else sys.stdout)
        return 2 if argv else 0
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
