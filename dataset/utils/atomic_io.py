"""Atomic file and folder writes: a path holds either the old content or the complete new one.

Temporary files and folders are created with ``os.open(..., 0o666)`` / ``os.mkdir(..., 0o777)`` rather
than ``tempfile.mkstemp`` / ``mkdtemp``, whose fixed private modes (0600 / 0700) would survive the
rename: results and datasets must get the permissions the umask gives any other file.
"""
from __future__ import annotations

import os
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

_ATTEMPTS = 100


def create_temp_file(folder: Path, prefix: str, suffix: str = ".tmp") -> str:
    """Create an empty, new file in ``folder`` (mode 0666 minus the umask) and return its path."""
    for _ in range(_ATTEMPTS):
        name = os.path.join(folder, f"{prefix}{secrets.token_hex(4)}{suffix}")
        try:
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return name
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name {prefix}*{suffix} in {folder}")


def create_temp_dir(folder: Path, prefix: str) -> Path:
    """Create a new, empty folder in ``folder`` (mode 0777 minus the umask) and return its path."""
    for _ in range(_ATTEMPTS):
        path = Path(folder) / f"{prefix}{secrets.token_hex(4)}"
        try:
            os.mkdir(path, 0o777)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary folder name {prefix}* in {folder}")


@contextmanager
def atomic_path(path: Path) -> Iterator[str]:
    """Yield a temporary path next to ``path``; on success it is renamed over ``path``.

    The temporary file lives in the same directory so the final ``os.replace`` is atomic on POSIX.
    On any exception the temporary file is removed and ``path`` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = create_temp_file(path.parent, f".{path.name}.")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_text_atomically(path: Path, text: str) -> None:
    """``path`` holds ``text`` (UTF-8), or, if the write fails part-way (a full disk), what it held before."""
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")


def replace_folder(new: Path, target: Path, keep: tuple = ()) -> None:
    """Put the complete folder ``new`` at ``target``, replacing what is there.

    ``new`` must be a sibling of ``target`` (same file system). When ``target`` does not exist this is
    one atomic rename. Otherwise the old folder is renamed aside first, entries of it named in ``keep``
    that ``new`` lacks (e.g. downloaded raw data) are moved into ``new``, ``new`` is renamed into place
    and the old folder removed: at no moment does ``target`` hold a mix of old and new files.
    """
    new, target = Path(new), Path(target)
    try:
        os.rename(new, target)  # fails unless target is absent or an empty folder
        return
    except OSError:
        if not target.is_dir():
            raise
    old = target.parent / f".{target.name}.old-{secrets.token_hex(4)}"
    os.rename(target, old)
    moved = []
    try:
        for name in keep:
            if (old / name).exists() and not (new / name).exists():
                os.rename(old / name, new / name)
                moved.append(name)
        os.rename(new, target)
    except BaseException:
        if not target.exists():  # put the old folder back, whole, rather than leave nothing
            for name in moved:
                os.rename(new / name, old / name)
            os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)
