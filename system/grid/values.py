"""Lists, flag strings and paths read exactly as the shell version of ``run_all.sh`` read them, so
that grid files and commands written for it keep their meaning."""
from __future__ import annotations

import os
import re
from typing import List

# Bash splits unquoted words on its default IFS only: space, tab and newline (no globbing, no quotes).
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
