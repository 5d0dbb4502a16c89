"""Printing progress while runs finish on other threads: one whole line at a time, flushed at once (a
batch takes hours, and its output is often piped into a log or another program)."""
from __future__ import annotations

import sys
import threading

# Reentrant: the signal handler that stops a batch prints too, and may interrupt the main thread
# while it holds the lock.
_LOCK = threading.RLock()


def say(line: str = "") -> None:
    _write(sys.stdout, line)


def warn(line: str) -> None:
    _write(sys.stderr, line)


def _write(stream, line: str) -> None:
    with _LOCK:
        stream.write(line + "\n")
        stream.flush()
