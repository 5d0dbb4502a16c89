"""Lists, flag strings and paths read by a shell's rules: words split on blanks only, a relative path
joined to its base as typed (not normalised), the working directory as the user's shell spells it. A
value in a grid file or after a flag thus means what the same words would mean on a command line."""
from __future__ import annotations

import os
import re
from typing import List

# Words are split on Bash's default IFS only: space, tab and newline (no globbing, no quotes).
_IFS = re.compile(r"[ \t\n]+")


def words(text: str) -> List[str]:
    """``text`` split into words, e.g. main.py flags from a grid line."""
    return [word for word in _IFS.split(text) if word]


def list_items(text: str) -> List[str]:
    """A grid list: words separated by spaces or commas ("FedAvg,FedLAG FedRep")."""
    return words(text.replace(",", " "))


def absolute(path: str, base: str) -> str:
    """``path`` made absolute against ``base`` by plain joining, not normalising: messages and logs
    show the path as typed after the base."""
    return path if path.startswith("/") else f"{base}/{path}"


def current_dir() -> str:
    """The working directory as the user's shell spells it ($PWD keeps symbolic links), when $PWD
    really is the working directory; else the resolved one."""
    pwd = os.environ.get("PWD", "")
    try:
        if pwd.startswith("/") and os.path.samefile(pwd, "."):
            return pwd
    except OSError:
        pass
    return os.getcwd()
