"""Progress output: one line per round, plus, on a terminal, one live tqdm line with an ETA.

The live line also shows where the current round is (``train 7/20``, ``evaluate 12/20``), so a long
round (CIFAR-10 / ResNet9 on a CPU: minutes) is never silent. The code that trains or evaluates
clients reports through :func:`current`, which is the open :class:`RoundReporter`, or a reporter
that does nothing when none is open (tests, tools, a server used outside :meth:`Server.train`).
When the output is not a terminal (a log file, a pipe) there is no live line: only the round lines
are written, so logs hold one line per round.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Optional

from utils.metrics import Summary

# The live line is redrawn at most this often (seconds): clients of a small dataset finish in
# milliseconds, and redrawing for each would cost more than the training.
REFRESH_SECONDS = 0.2


def format_round(rnd: int, last: int, seconds: float, summary: Optional[Summary]) -> str:
    """``round  3/50 | acc ... | 1.23 s``: the line printed after each round."""
    line = f"round {rnd:>{len(str(last))}}/{last}"
    if summary is not None:
        line += (f" | acc {summary.accuracy:.4f} | auc {summary.auc:.4f} | loss {summary.train_loss:.4f}"
                 f" | std {summary.accuracy_std:.4f}")
    return line + f" | {seconds:.2f} s"


def _terminal_width(stream) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 0


class QuietProgress:
    """The reporter in force when no round loop runs: stages and steps are ignored."""

    def begin(self, stage: str, total: int) -> None:
        """A stage of the current round starts: ``total`` steps (clients) of ``stage``."""

    def advance(self, steps: int = 1) -> None:
        """``steps`` more steps of the current stage are done."""


_QUIET = QuietProgress()
_current: Optional["RoundReporter"] = None


def current():
    """The open :class:`RoundReporter`, or a :class:`QuietProgress` when none is open."""
    return _current if _current is not None else _QUIET


class RoundReporter(QuietProgress):
    """Prints :func:`format_round` lines; on a TTY they scroll above a tqdm line with an ETA and the
    current round's stage. While open it is what :func:`current` returns."""

    def __init__(self, total_rounds: int, title: str = "", stream=None, first: int = 0):
        """``total_rounds`` still to run, numbered from ``first`` (non-zero when a run resumes)."""
        global _current
        self.stream = stream or sys.stdout
        self.last = first + total_rounds - 1
        self.bar = None
        self.stage, self.done, self.total = "", 0, 0
        self._drawn = 0.0
        if self.stream.isatty():
            from tqdm import tqdm
            # A terminal that reports no width (a bare pseudo-terminal) would get an empty line.
            sized = _terminal_width(self.stream) > 0
            self.bar = tqdm(total=total_rounds, desc=title, unit="round", file=self.stream, leave=False,
                            dynamic_ncols=sized, ncols=None if sized else 100)
        _current = self

    def begin(self, stage: str, total: int) -> None:
        self.stage, self.done, self.total = stage, 0, total
        self._show(force=True)

    def advance(self, steps: int = 1) -> None:
        self.done += steps
        self._show(force=self.done >= self.total)

    def _show(self, force: bool = False) -> None:
        if self.bar is None:
            return
        now = time.monotonic()
        if not force and now - self._drawn < REFRESH_SECONDS:
            return
        self._drawn = now
        self.bar.set_postfix_str(f"{self.stage} {self.done}/{self.total}" if self.stage else "", refresh=True)

    def round_done(self, rnd: int, seconds: float, summary: Optional[Summary]) -> None:
        self.note(format_round(rnd, self.last, seconds, summary))
        self.stage = ""
        if self.bar is not None:
            self.bar.set_postfix_str("", refresh=False)
            self.bar.update(1)

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        global _current
        if _current is self:
            _current = None
        if self.bar is not None:
            self.bar.close()
