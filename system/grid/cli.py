"""The ``run_all.sh`` command: its flags in, a batch run, its exit status out (2: bad usage, 130: Ctrl-C)."""
from __future__ import annotations

import os
import signal
import sys
from typing import Optional, Sequence

from grid.command_line import parse_command_line
from grid.passed_flags import check_passed_flags
from grid.plan import plan_runs
from grid.session import run_batch
from grid.settings import Settings, resolve_settings
from grid.usage import PROGRAM, USAGE, UsageError


def settings_from_flags(argv: Sequence[str]) -> Settings:
    """The settings ``run_all.sh <argv>`` would run with (``-h`` has no settings: see :func:`main`)."""
    settings = resolve_settings(parse_command_line(argv))
    check_passed_flags(settings)
    return settings


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        line = parse_command_line(argv)
        if line.show_help:
            sys.stdout.write(USAGE)
            return 0
        settings = resolve_settings(line)
        check_passed_flags(settings)
        return run_batch(settings, plan_runs(settings)).exit_code
    except UsageError as err:
        print(f"{PROGRAM}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C outside the runs (reading results, building data): quietly, as 130
        return 130
    except BrokenPipeError:  # output piped into e.g. head, which has exited: stop quietly, as a shell would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return 128 + signal.SIGPIPE
