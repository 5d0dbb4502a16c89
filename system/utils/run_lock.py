"""One process at a time per results name: an ``flock`` on ``<name>.lock`` next to the run's ``.h5``."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Tuple

from utils.errors import UserError


class RunLockedError(UserError, RuntimeError):
    """Another live process is writing results under the same name; the message names it."""


def lock_path(results_file: Path) -> Path:
    """The lock file of a results name: next to its ``.h5``, holding the owner's process id."""
    return Path(results_file).with_suffix(".lock")


class RunLock:
    """Exclusive use of a results name by this process, held until :meth:`release`.

    The lock is an ``flock`` on ``<name>.lock``, which the kernel drops when the process dies (even by
    SIGKILL), so a lock file left by a dead run is simply taken over. The file holds the owner's pid for
    the message a second run prints.
    """

    def __init__(self, results_file: Path):
        self.path = lock_path(results_file)
        self.fd: Optional[int] = None
        self.took_over: Optional[int] = None  # pid in a stale lock file that was taken over

    def acquire(self) -> "RunLock":
        import fcntl
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = _read_pid(fd)
                os.close(fd)
                raise RunLockedError(_locked_message(self.path, holder)) from None
            # The owner may have removed the file between our open and flock (and a third run made a new
            # one): a lock on a removed file protects nothing, so try again on the current file.
            try:
                current = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
            if current:
                break
            os.close(fd)
        self.took_over = _read_pid(fd)
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        except OSError:  # e.g. a full disk: give the lock back rather than hold it unnamed
            os.close(fd)
            raise
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # removed while still held: no one can lock a dead file
        except OSError:
            pass  # the folder is gone or not writable any more; the lock ends with the descriptor anyway
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire() if self.fd is None else self

    def __exit__(self, *exc) -> None:
        self.release()


def check_unlocked(results_file: Path) -> None:
    """Raise :class:`RunLockedError` if a live process holds the lock of ``results_file`` (takes nothing)."""
    held, pid = lock_holder(results_file)
    if held:
        raise RunLockedError(_locked_message(lock_path(results_file), pid))


def lock_holder(results_file: Path) -> Tuple[bool, Optional[int]]:
    """(whether a live process holds the lock of ``results_file``, its pid when the lock file names it);
    takes nothing."""
    import fcntl
    try:
        fd = os.open(lock_path(results_file), os.O_RDONLY)
    except OSError:
        return False, None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True, _read_pid(fd)
    finally:
        os.close(fd)
    return False, None


def _read_pid(fd: int) -> Optional[int]:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None


def _locked_message(path: Path, pid: Optional[int]) -> str:
    owner = f"process {pid}" if pid else "another process"
    return (f"{path.with_suffix('.h5').name} is being written by {owner} (lock {path}); wait for that run "
            f"to end, or give this one another -go/--goal or --results_dir")
