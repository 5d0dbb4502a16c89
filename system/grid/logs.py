"""Per-run log files: where they are and the lines the batch quotes from them."""
from __future__ import annotations

import re
from typing import Optional

_BLANK = re.compile(r"^[ \t\n\r\f\v]*$")
# A failure reason is one line of the summary, not a screenful.
REASON_WIDTH = 200


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
