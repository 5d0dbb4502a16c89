"""Messages that fit on one line: a command-line parser whose refusals are one line, and an error's
reason cut to a readable length.

argparse's own ``error()`` prints the whole usage block first (28 lines for ``system/main.py``), which
buries the one line that matters; :class:`OneLineParser` prints ``error: <what is wrong> (<command>
--help lists every flag)`` and exits with status 2. Every command of the project (``system/main.py``,
``system/report.py``, ``dataset/generate_*.py``) builds its parser from it. The module lives beside
the generators because they import only the repository root; ``system/`` imports it from here too.
"""
from __future__ import annotations

import argparse
import re
from typing import NoReturn, Optional

_HINT = " ({} lists every flag)"
# An error's reason inside a one-line message: torchvision's download error alone lists every mirror it
# tried (about 300 characters for MNIST); an HTML error page can be far longer.
REASON_LIMIT = 400


class OneLineParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` that refuses bad input in one line naming how to get the full help.

    ``help_command`` is what a user types for the help, e.g. ``python system/main.py --help``
    (default: ``<prog> --help``).
    """

    def __init__(self, *args, help_command: Optional[str] = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.help_command = help_command or f"{self.prog} --help"

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {one_line(message)}{_HINT.format(self.help_command)}\n")


def refusal(printed: str) -> str:
    """What was refused, from the line :meth:`OneLineParser.error` printed: no ``error:``, no help hint
    (for a caller that words it for its own users, as the Flower app does with its run-config keys)."""
    text = one_line(printed).split("error: ", 1)[-1]
    return re.sub(re.escape(_HINT).replace(re.escape("{}"), r"[^()]*") + "$", "", text)


def one_line(text: str) -> str:
    """``text`` with every run of white space (line breaks included) made one space."""
    return " ".join(str(text).split())


def error_reason(err: BaseException, limit: int = REASON_LIMIT) -> str:
    """An exception's reason (``err.reason`` for a URL error, else its text), :func:`shortened`."""
    return shortened(getattr(err, "reason", None) or err, limit)


def shortened(text: object, limit: int = REASON_LIMIT) -> str:
    """``text`` on one line, at most ``limit`` characters: a longer one is cut after its last whole word
    and ends in " ...", never mid-word."""
    text = one_line(text)
    if len(text) <= limit:
        return text
    window = text[:limit - len(" ...") + 1]   # a space at its last place still ends a whole word
    cut = window[:window.rfind(" ")] if " " in window else window[:-1]
    return cut.rstrip(" ,;:") + " ..."
