"""Per-run log files: who writes one, and the lines the batch quotes from them.

A log belongs to the batch that claims it (:func:`claim_log`) and to the process it starts with it: a
second batch over the same results folder finds the log claimed and leaves it alone, so no log ever holds
two runs' lines.
"""
from __future__ import annotations

import fcntl
import os
import re
from typing import Optional, TextIO

_BLANK = re.compile(r"^[ \t\n\r\f\v]*$")
# A failure reason is one line of the summary, not a screenful.
REASON_WIDTH = 200


def claim_log(path: str) -> Optional[TextIO]:
    """The log at ``path``, emptied and open for writing, when no other process holds it; None while one
    does (another batch running that run, or building that dataset).

    The claim is an ``flock`` on the log itself, so it lasts as long as any descriptor of it is open: a
    run started with the log as its output keeps it after the batch closes its own, and the kernel drops
    it when the last holder ends, however it ends.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError:
        pass  # a file system without locks: the log is written as it always was
    os.ftruncate(fd, 0)  # only once it is ours: the other holder's lines stay whole
    return os.fdopen(fd, "w", encoding="utf-8")


def read_log(path: str) -> Optional[str]:
    """The text of a log, or None when it cannot be read. Line ends are kept as written (``newline=""``):
    a progress bar's carriage returns stay inside their line, as ``tail`` shows them."""
    try:
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            return f.read()
    except OSError:
        return None


def last_line(path: str) -> str:
    """The log's last line, as ``tail -n 1`` gives it (what a generator printed last)."""
    text = read_log(path) or ""
    if text.endswith("\n"):
        text = text[:-1]
    return text.rsplit("\n", 1)[-1]


def last_nonblank_line(path: str) -> str:
    """The log's last line that is not blank, cut to :data:`REASON_WIDTH` characters: usually the error."""
    lines = [line for line in (read_log(path) or "").split("\n") if not _BLANK.match(line)]
    return lines[-1][:REASON_WIDTH] if lines else ""
