"""Checkpoints of a whole run, so a killed run continues exactly where it stopped.

Checkpoints belong to one configuration of one results name:
``<results>/checkpoints/<data>_<algo>_<goal>_<run>/<key>/`` where ``<key>`` is a hash of the flags that
change results (:func:`config_key`), so another run under the same name with other flags (more rounds,
another learning rate) neither resumes from them nor removes them. The folder holds ``round_<r>.pt``
(``torch.save`` of plain containers: loads with ``weights_only=True``) and ``round_<r>.sha256`` (its
checksum). Both are written atomically, the checksum last, so a checkpoint without a matching checksum -
truncated, corrupt, or cut off mid-write - is skipped and the previous good one is used. The newest
``KEEP`` checkpoints are kept; the folder is removed when the run completes.
"""
from __future__ import annotations

import hashlib
import io
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from dataset.utils.atomic_io import atomic_path
from utils.errors import UserError, first_line
from utils.run_identity import EXECUTION_FLAGS, REPORTING_FLAGS

KEEP = 2
# The client-state store's files (flcore/clients/spill_files.py), inside a run's checkpoint folder.
CLIENT_STATE_FOLDER = "client-state"
_NAME = re.compile(r"round_(\d+)\.pt$")
# Flags that change where or how fast a run executes, or how its finished series is summarised; never
# the series itself.
IGNORED_ON_RESUME = EXECUTION_FLAGS | REPORTING_FLAGS


class CheckpointError(UserError, ValueError):
    """A checkpoint cannot be used for this run; the message says why."""


@dataclass(frozen=True)
class Checkpoint:
    round: int
    payload: dict
    skipped: Tuple[str, ...]  # newer checkpoints that were unusable, with the reason
    path: Optional[Path] = None


def config_key(config: Dict[str, object], defaults: Dict[str, object]) -> str:
    """A short hash of the flags that change results (every flag but :data:`IGNORED_ON_RESUME`) and are
    not at their default (``defaults``: every flag's), so that a flag added in a later version leaves
    earlier checkpoints findable."""
    kept = {k: v for k, v in config.items()
            if k not in IGNORED_ON_RESUME and not (k in defaults and defaults[k] == v)}
    text = json.dumps(kept, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def checkpoint_folder(results_file: Path, config: Dict[str, object], defaults: Dict[str, object]) -> Path:
    """The checkpoint folder of the run whose results go to ``results_file``, made with flags ``config``
    (``defaults``: every flag's default)."""
    return checkpoint_root(results_file) / config_key(config, defaults)


def checkpoint_root(results_file: Path) -> Path:
    """The folder holding the checkpoint folders of every configuration run under this results name."""
    results_file = Path(results_file)
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


def rng_state_problem(state: object) -> Optional[str]:
    """Why ``state`` is not a :func:`global_rng_state` output (None if it is one)."""
    try:
        live = global_rng_state()
        ok = (isinstance(state, dict) and set(state) == set(live)
              and isinstance(state["torch"], torch.Tensor) and state["torch"].shape == live["torch"].shape
              and state["torch"].dtype == live["torch"].dtype
              and isinstance(state["python"], list) and len(state["python"]) == 3
              and isinstance(state["python"][1], list) and len(state["python"][1]) == len(live["python"][1])
              and isinstance(state["numpy"], list) and len(state["numpy"]) == 5
              and isinstance(state["numpy"][1], torch.Tensor) and state["numpy"][1].shape == live["numpy"][1].shape)
    except (KeyError, TypeError, AttributeError):
        ok = False
    return None if ok else "rng: not the random generators' state"


def save_checkpoint(folder: Path, rnd: int, payload: dict) -> Path:
    """Write ``payload`` as the checkpoint of round ``rnd`` and prune this folder's older ones.

    Checkpoints of rounds after ``rnd`` (left by an earlier attempt of the same configuration that was
    started again without ``--resume``) are removed too: the newest checkpoint is always this run's. Older
    ones are pruned only once this one is complete, so a write that fails (a full disk) keeps them.
    """
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    data = buffer.getvalue()
    path = folder / f"round_{rnd:06d}.pt"
    with atomic_path(path) as tmp:
        Path(tmp).write_bytes(data)
    try:
        with atomic_path(path.with_suffix(".sha256")) as tmp:
            Path(tmp).write_text(hashlib.sha256(data).hexdigest() + "\n", encoding="ascii")
    except OSError:  # e.g. the disk filled: a checkpoint without its checksum is never used, so free its space
        path.unlink(missing_ok=True)
        raise
    older = [p for p in _checkpoints(folder) if _round_of(p) <= rnd]
    for old in [p for p in _checkpoints(folder) if _round_of(p) > rnd] + older[KEEP:]:
        old.unlink(missing_ok=True)
        old.with_suffix(".sha256").unlink(missing_ok=True)
    return path


def load_latest_checkpoint(folder: Path, check: Optional[Callable[[dict], Optional[str]]] = None
                           ) -> Optional[Checkpoint]:
    """The newest usable checkpoint in ``folder``; None when there is none at all.

    Usable: its checksum matches, it loads with ``weights_only=True``, and ``check(payload)`` (if
    given) returns no reason to refuse it. The round is the payload's (:func:`payload_round`), the file
    name's only for a payload that has none (a run's ``check`` refuses those). Newer unusable ones are
    listed in ``skipped``; when every checkpoint is unusable, :class:`CheckpointError` lists why.
    """
    skipped: List[str] = []
    for path in _checkpoints(folder):
        reason = _verify(path)
        payload = None
        if reason is None:
            try:
                payload = torch.load(path, weights_only=True)
            except Exception as err:  # a matching checksum but an unloadable file: report and go on
                reason = f"cannot be loaded ({first_line(err)})"
        if reason is None and check is not None:
            reason = check(payload)
        if reason is None:
            rnd = payload_round(payload)
            return Checkpoint(_round_of(path) if rnd is None else rnd, payload, tuple(skipped), path)
        skipped.append(f"{path.name}: {reason}")
    if skipped:
        raise CheckpointError(f"no usable checkpoint in {folder}: " + "; ".join(skipped))
    return None


def payload_round(payload: object) -> Optional[int]:
    """The round a checkpoint was taken after: its ``round`` entry, or for checkpoints written before
    that entry existed, the server's saved ``current_round`` (the same number). Never the file name."""
    if not isinstance(payload, dict):
        return None
    rnd = payload.get("round")
    if rnd is None and isinstance(payload.get("server"), dict):
        rnd = payload["server"].get("current_round")
    if isinstance(rnd, torch.Tensor) and rnd.numel() == 1:
        rnd = rnd.item()
    if isinstance(rnd, bool) or not isinstance(rnd, int) or rnd < 0:
        return None
    return rnd


def has_checkpoints(folder: Path) -> bool:
    return bool(_checkpoints(folder))


def other_checkpoint_folders(folder: Path) -> List[Path]:
    """Folders next to ``folder`` with checkpoints of the same results name made with other flags,
    newest first; the results name's own folder counts when it holds checkpoints directly (the layout
    before checkpoints were keyed by configuration)."""
    root = Path(folder).parent
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p != Path(folder) and _checkpoints(p)]
    if _checkpoints(root):
        found.append(root)
    return sorted(found, key=lambda p: max(q.stat().st_mtime for q in _checkpoints(p)), reverse=True)


def remove_checkpoints(folder: Path) -> None:
    """Remove the checkpoints in ``folder`` (with the client-state files they name, and files a killed write
    left behind), then the folder, the
    results name's folder and ``checkpoints/`` itself when nothing else is in them: other
    configurations' and other runs' checkpoints stay."""
    folder = Path(folder)
    for path in _checkpoints(folder):
        path.unlink(missing_ok=True)
        path.with_suffix(".sha256").unlink(missing_ok=True)
    if folder.is_dir():
        store = folder / CLIENT_STATE_FOLDER
        for leftover in [*folder.glob(".round_*.tmp"), *folder.glob("round_*.sha256"), *store.glob("*.safetensors"),
                         *store.glob(".*")]:
            if not leftover.is_dir():  # the run writes files only: a folder under such a name is someone's
                leftover.unlink(missing_ok=True)
        try:
            store.rmdir()  # the client-state files went with the checkpoints that named them
        except OSError:
            pass
    for empty in (folder, folder.parent, folder.parent.parent):
        try:
            empty.rmdir()  # only succeeds when empty
        except OSError:
            break


def config_differences(saved: Dict[str, object], current: Dict[str, object], defaults: Dict[str, object]
                       ) -> List[str]:
    """Flags whose values differ between a checkpoint and the current command. A flag one side does not
    record (it did not exist yet) counts as its default (``defaults``: every flag's)."""
    keys = (set(saved) | set(current)) - IGNORED_ON_RESUME
    differing = []
    for k in sorted(keys):
        before, now = saved.get(k, defaults.get(k)), current.get(k, defaults.get(k))
        if before != now:
            differing.append(f"--{k}: {before!r} in the checkpoint, {now!r} now")
    return differing


def _round_of(path: Path) -> int:
    return int(_NAME.search(path.name).group(1))


def _checkpoints(folder: Path) -> List[Path]:
    """Checkpoint files, newest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if _NAME.search(p.name) and p.is_file()]
    return sorted(found, key=_round_of, reverse=True)


def _verify(path: Path) -> Optional[str]:
    checksum = path.with_suffix(".sha256")
    if not checksum.is_file():
        return "no checksum (the write was interrupted)"
    try:
        expected = checksum.read_bytes().decode("ascii").strip()
    except UnicodeDecodeError:
        return f"{checksum.name} is not a checksum (not text); delete both files"
    except OSError as err:
        return f"{checksum.name} cannot be read ({err.strerror or err})"
    if not re.fullmatch(r"[0-9a-f]{64}", expected):
        return f"{checksum.name} is not a SHA-256 checksum; delete both files"
    if hashlib.sha256(path.read_bytes()).hexdigest() != expected:
        return "checksum mismatch (truncated or corrupt)"
    return None
