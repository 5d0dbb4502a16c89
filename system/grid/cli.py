"""The ``run_all.sh`` command: its flags in, a batch run, its exit status out (2: bad usage, 130: Ctrl-C)."""
from __future__ import annotations

import os
import signal
import sys
from typing import Optional, Sequence

from grid.checks import check_batch
from grid.command_line import parse_command_line
from grid.session import run_batch, show_refused
from grid.settings import Settings, resolve_settings
from grid.usage import PROGRAM, USAGE, UsageError


def settings_from_flags(argv: Sequence[str]) -> Settings:
    """The settings ``run_all.sh <argv>`` would run with (``-h`` has no settings: see :func:`main`); raises
    :class:`UsageError` listing every problem of the batch."""
    settings = resolve_settings(parse_command_line(argv))
    checked = check_batch(settings)
    if checked.problems:
        raise checked.error()
    return settings


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        line = parse_command_line(argv)
        if line.show_help:
            sys.stdout.write(USAGE)
            return 0
        settings = resolve_settings(line)
        checked = check_batch(settings)  # the whole grid, before anything starts
        if checked.problems:
            if settings.dry_run:
                show_refused(checked)
            raise checked.error()
        return run_batch(settings, checked.plan).exit_code
    except UsageError as err:
        print(f"{PROGRAM}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C outside the runs (reading results, building data): quietly, as 130
        return 130
    except BrokenPipeError:  # output piped into e.g. head, which has exited: stop quietly, as a shell would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return 128 + signal.SIGPIPE
