"""The signals that ask a run to stop, turned into one exception the round loop catches.

Ctrl-C raises ``KeyboardInterrupt`` (SIGINT). SIGTERM (``kill``, a batch's ``--timeout``, a cluster
scheduler at its time limit) and SIGHUP (a closed terminal) would end the process at once, losing every
round done; while :func:`stop_signals_raise` is active they raise :class:`StopRequested`, a
``KeyboardInterrupt`` too, so the loop saves the rounds so far once, whatever the signal, and the process
still ends with the status a shell expects of that signal (128 + its number).
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

# The signals that ask a process to end and can be caught; SIGINT already raises KeyboardInterrupt.
RAISED_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
STOP_SIGNALS = (signal.SIGINT, *RAISED_SIGNALS)


class StopRequested(KeyboardInterrupt):
    """A stop signal other than SIGINT arrived; ``signum`` says which."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def signal_of(interrupt: KeyboardInterrupt) -> signal.Signals:
    """The signal behind ``interrupt``: its own for :class:`StopRequested`, SIGINT for Ctrl-C."""
    return signal.Signals(getattr(interrupt, "signum", signal.SIGINT))


def exit_status(interrupt: KeyboardInterrupt) -> int:
    """What a shell reports for a process ended by the signal behind ``interrupt`` (130 for Ctrl-C)."""
    return 128 + signal_of(interrupt)


def _raise_stop(signum: int, _frame) -> None:
    raise StopRequested(signum)


def _in_main_thread() -> bool:
    # Python installs signal handlers from the main thread only (tests call main() from workers too).
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def stop_signals_raise() -> Iterator[None]:
    """While active, SIGTERM and SIGHUP raise :class:`StopRequested` (a signal the process was told to
    ignore, e.g. under ``nohup``, stays ignored); the previous handlers come back afterwards."""
    previous = {}
    if _in_main_thread():
        for number in RAISED_SIGNALS:
            if signal.getsignal(number) is not signal.SIG_IGN:
                previous[number] = signal.signal(number, _raise_stop)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextlib.contextmanager
def stop_signals_deferred() -> Iterator[None]:
    """While active, a further stop signal is noted and dropped: the run is stopping already, and a second
    Ctrl-C must not abandon the results file being written for the first."""
    previous = {}
    if _in_main_thread():
        for number in STOP_SIGNALS:
            if signal.getsignal(number) is not signal.SIG_IGN:
                previous[number] = signal.signal(number, lambda *_: None)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
