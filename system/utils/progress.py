"""Progress output: one line per round, plus a live bar with ETA when writing to a terminal."""
from __future__ import annotations

import sys
from typing import Optional

from utils.metrics import Summary


def format_round(rnd: int, last: int, seconds: float, summary: Optional[Summary]) -> str:
    line = f"round {rnd:>{len(str(last))}}/{last}"
    if summary is not None:
        line += (f" | acc {summary.accuracy:.4f} | auc {summary.auc:.4f} | loss {summary.train_loss:.4f}"
                 f" | std {summary.accuracy_std:.4f}")
    return line + f" | {seconds:.2f} s"


class RoundReporter:
    """Prints :func:`format_round` lines; on a TTY they scroll above a tqdm bar with an ETA."""

    def __init__(self, total_rounds: int, title: str = "", stream=None, first: int = 0):
        """``total_rounds`` still to run, numbered from ``first`` (non-zero when a run resumes)."""
        self.stream = stream or sys.stdout
        self.last = first + total_rounds - 1
        self.bar = None
        if self.stream.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total_rounds, desc=title, unit="round", file=self.stream, leave=False)

    def round_done(self, rnd: int, seconds: float, summary: Optional[Summary]) -> None:
        self.note(format_round(rnd, self.last, seconds, summary))
        if self.bar is not None:
            self.bar.update(1)

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
