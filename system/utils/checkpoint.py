"""Checkpoints of a whole run, so a killed run continues exactly where it stopped.

One folder per run (the run's results name): ``<results>/checkpoints/<data>_<algo>_<goal>_<run>/``
holding ``round_<r>.pt`` (``torch.save`` of plain containers: loads with ``weights_only=True``) and
``round_<r>.sha256`` (its checksum). Both are written atomically, the checksum last, so a checkpoint
without a matching checksum - truncated, corrupt, or cut off mid-write - is skipped and the previous
good one is used. The newest ``KEEP`` checkpoints are kept; all are removed when the run completes.
"""
from __future__ import annotations

import hashlib
import io
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from utils.paths import make_importable

make_importable()
from dataset.utils.atomic_io import atomic_path  # noqa: E402
from utils.result_utils import EXECUTION_FLAGS  # noqa: E402

KEEP = 2
_NAME = re.compile(r"round_(\d+)\.pt$")
# Flags that change where or how fast a run executes, never its results.
IGNORED_ON_RESUME = EXECUTION_FLAGS


class CheckpointError(ValueError):
    """A checkpoint cannot be used for this run; the message says why."""


@dataclass(frozen=True)
class Checkpoint:
    round: int
    payload: dict
    skipped: Tuple[str, ...]  # newer checkpoints that were unreadable, with the reason


def checkpoint_folder(results_file: Path) -> Path:
    return results_file.parent / "checkpoints" / results_file.stem


def global_rng_state() -> dict:
    py = random.getstate()
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": [py[0], list(py[1]), py[2]],
            "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]]}


def set_global_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))


def save_checkpoint(folder: Path, rnd: int, payload: dict) -> Path:
    """Write ``payload`` as the checkpoint of round ``rnd`` and prune old ones."""
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    data = buffer.getvalue()
    path = folder / f"round_{rnd:06d}.pt"
    with atomic_path(path) as tmp:
        Path(tmp).write_bytes(data)
    with atomic_path(path.with_suffix(".sha256")) as tmp:
        Path(tmp).write_text(hashlib.sha256(data).hexdigest() + "\n")
    for old in _checkpoints(folder)[KEEP:]:
        old.unlink(missing_ok=True)
        old.with_suffix(".sha256").unlink(missing_ok=True)
    return path


def load_latest_checkpoint(folder: Path) -> Optional[Checkpoint]:
    """The newest checkpoint whose checksum matches; unreadable newer ones are listed in ``skipped``."""
    skipped: List[str] = []
    for path in _checkpoints(folder):
        reason = _verify(path)
        if reason is None:
            try:
                payload = torch.load(path, weights_only=True)
                return Checkpoint(int(_NAME.search(path.name).group(1)), payload, tuple(skipped))
            except Exception as err:  # a matching checksum but an unloadable file: report and go on
                reason = f"cannot be loaded ({err})"
        skipped.append(f"{path.name}: {reason}")
    if skipped:
        raise CheckpointError(f"no usable checkpoint in {folder}: " + "; ".join(skipped))
    return None


def remove_checkpoints(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def config_differences(saved: Dict[str, object], current: Dict[str, object]) -> List[str]:
    """Flags whose values differ between a checkpoint and the current command."""
    keys = (set(saved) | set(current)) - IGNORED_ON_RESUME
    return [f"--{k}: {saved.get(k)!r} in the checkpoint, {current.get(k)!r} now"
            for k in sorted(keys) if saved.get(k) != current.get(k)]


def _checkpoints(folder: Path) -> List[Path]:
    """Checkpoint files, newest first."""
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if _NAME.search(p.name)]
    return sorted(found, key=lambda p: int(_NAME.search(p.name).group(1)), reverse=True)


def _verify(path: Path) -> Optional[str]:
    checksum = path.with_suffix(".sha256")
    if not checksum.is_file():
        return "no checksum (the write was interrupted)"
    if hashlib.sha256(path.read_bytes()).hexdigest() != checksum.read_text().strip():
        return "checksum mismatch (truncated or corrupt)"
    return None
