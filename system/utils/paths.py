"""Locations inside the repository, resolved from this file so the working directory never matters."""
from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SYSTEM_DIR = REPO_ROOT / "system"
DATASET_DIR = REPO_ROOT / "dataset"
RESULTS_DIR = REPO_ROOT / "results"


def display_path(path: Path) -> str:
    """``path`` relative to the repository when inside it (for messages and logs)."""
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


# Flags holding locations: recorded relative to the repository so that committed results name no machine.
LOCATION_FLAGS = ("data_dir", "results_dir")


def portable_config(config: dict) -> dict:
    """``config`` with its location flags made relative to the repository when they lie inside it."""
    return {key: display_path(value) if key in LOCATION_FLAGS and value else value
            for key, value in config.items()}


def recorded_location(value: str) -> Path:
    """A location recorded by ``portable_config``, resolved again (relative ones are under the repository)."""
    path = Path(value)
    return path if path.is_absolute() else REPO_ROOT / path


# Besides letters and digits, what a name (a dataset, a goal, an algorithm) may hold.
NAME_PUNCTUATION = "-._+"


def unsafe_name_reason(value: str) -> str:
    """Why ``value`` cannot be one component of a file name, or "" when it can.

    Dataset names and result goals become parts of paths (``<data_dir>/<dataset>/``,
    ``<results_dir>/<dataset>_<algo>_<goal>_<run>.h5``); a separator or ``..`` would reach outside
    those folders, and a space, a newline, ``*`` or a quote would make the file awkward or unsafe to
    name in a shell: a name is letters, digits and ``- . _ +``.
    """
    if not value:
        return "is empty"
    if "/" in value or "\\" in value:
        return "contains a path separator"
    if value in (".", "..") or ".." in value:
        return "contains '..'"
    odd = next((c for c in value if not (c.isalnum() or c in NAME_PUNCTUATION)), None)
    if odd is not None:
        return f"contains the character {odd!r}"
    return ""


def check_name(value: str, flag: str, error: type = ValueError) -> str:
    """Return ``value`` when it is a plain name (see :func:`unsafe_name_reason`), else raise
    ``error`` with a one-line message naming ``flag``."""
    reason = unsafe_name_reason(str(value))
    if reason:
        raise error(f"{flag} {value!r} {reason}; it is part of a file name: use a plain name "
                    f"(letters, digits, '-', '.', '_', '+')")
    return value
