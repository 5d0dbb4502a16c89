"""LEAF's preprocessed JSON (github.com/TalwalkarLab/leaf), the source of the naturally split datasets.

A LEAF file is ``{"users": [...], "user_data": {user: {"x": [...], "y": [...]}}}``: a user is a writer
(FEMNIST) or a speaking role (Shakespeare) and becomes one client. LEAF writes one or several such files
(``all_data/``, or ``train/`` and ``test/`` with each user's samples cut in two), so a user's samples are
pooled over every file given. LEAF downloads and cuts the raw data itself; a generator only reads its
output, which is why these datasets have no download of their own. Which users become clients is
``natural.chosen_groups``'s choice, as for every naturally split dataset.
"""
from __future__ import annotations

import json
import operator
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

from dataset.utils.client_files import DatasetFileError

# user -> (samples, labels), in whatever form the dataset's ``convert`` gives them.
Users = Dict[str, Tuple[Any, Any]]
# One user's raw x and y lists from one file -> the form kept; raises ValueError or TypeError when they
# are not what the dataset stores.
Convert = Callable[[list, list], Tuple[Any, Any]]


def as_lists(x: list, y: list) -> Tuple[list, list]:
    """The default :data:`Convert`: keep both as Python lists."""
    return list(x), list(y)


def leaf_files(source: Path) -> List[Path]:
    """``source`` itself, or every ``*.json`` in the folder ``source``, in name order."""
    source = Path(source)
    if source.is_dir():
        files = sorted(source.glob("*.json"))
        if not files:
            raise FileNotFoundError(f"--source folder {source} holds no .json files")
        return files
    if source.is_file():
        return [source]
    raise FileNotFoundError(f"--source {source} does not exist")


def read_users(source: Path, convert: Convert = as_lists, pool: Callable[[Any, Any], Any] = operator.add,
               noun: str = "user") -> Users:
    """Every user's samples from one LEAF file or a folder of them.

    ``convert`` turns one user's lists from one file into the form kept (a file is converted as soon as it
    is parsed, so only one file's Python lists are alive at a time); ``pool`` joins a user's parts from
    two files (list concatenation by default). A file that is not LEAF JSON is named, with the reason.
    """
    users: Users = {}
    for path in leaf_files(source):
        user = None
        try:
            user_data = json.loads(path.read_text(encoding="utf-8"))["user_data"]
            for user, samples in user_data.items():
                x, y = convert(samples["x"], samples["y"])
                if user in users:
                    x, y = pool(users[user][0], x), pool(users[user][1], y)
                users[user] = (x, y)
        # ValueError covers undecodable text and bad JSON, and what ``convert`` refuses.
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            where = "" if user is None else f", at {noun} {user!r}"
            raise DatasetFileError(f"{path} is not LEAF JSON: user_data with x and y per {noun}{where} "
                                   f"({type(err).__name__}: {err})") from None
    return users
