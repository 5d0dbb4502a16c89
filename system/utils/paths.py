"""Locations inside the repository, resolved from this file so the working directory never matters."""
from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SYSTEM_DIR = REPO_ROOT / "system"
DATASET_DIR = REPO_ROOT / "dataset"
RESULTS_DIR = REPO_ROOT / "results"


def make_importable() -> None:
    """Let ``dataset.utils`` (shared file format and generators) be imported from ``system/``."""
    root = str(REPO_ROOT)
    if root not in sys.path:
        sys.path.append(root)


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
