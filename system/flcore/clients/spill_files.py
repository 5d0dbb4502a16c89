"""Files of spilled client state: written, checked, read back and removed, for the client-state store
(:mod:`flcore.clients.state_store`), which decides *whose* entry goes to a file and when.

Files are safetensors (tensors only: nothing is executed to load them), named by the SHA-256 of their
bytes, written atomically and never changed; their mode follows the umask, as the checkpoints beside them
do. A file whose bytes do not hash to its name was truncated or altered; it is named and refused, and a
spill of the same bytes puts a good file in its place. A file stays while a client's entry is in it or a
kept checkpoint names it (a checkpoint records which file holds each spilled client's entry: shared
tensors are saved once, own ones once, not one model copy per client). A folder at a file's name is not
ours: it is left alone, and a spill that needs the name stops the run saying so.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import tempfile
import weakref
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, FrozenSet, Mapping, Optional

import torch

from dataset.utils.atomic_io import create_temp_file

Tensors = Dict[str, torch.Tensor]
_FILE = re.compile(r"[0-9a-f]{64}\.safetensors")

class StoreError(RuntimeError):
    """A spill or a read-back that failed, in one line for the user. ``resumable``: the run can continue
    from its checkpoints once the cause is fixed (a full disk), as opposed to a file that was altered."""

    def __init__(self, message: str, resumable: bool = False):
        super().__init__(message)
        self.resumable = resumable


@dataclass(frozen=True)
class SpillRecord:
    """Where a client's own tensors went: the file's SHA-256 (its name), its size, and their device."""
    digest: str
    nbytes: int
    device: str

    def as_state(self) -> dict:
        return {"digest": self.digest, "bytes": self.nbytes, "device": self.device}

    @classmethod
    def from_state(cls, value: object) -> "SpillRecord":
        """From :meth:`as_state`'s dict; ValueError for anything else."""
        if not (isinstance(value, dict) and set(value) == {"digest", "bytes", "device"}
                and isinstance(value["digest"], str) and re.fullmatch(r"[0-9a-f]{64}", value["digest"])
                and isinstance(value["bytes"], int) and not isinstance(value["bytes"], bool) and value["bytes"] >= 0
                and isinstance(value["device"], str)):
            raise ValueError("not a record of the client-state store")
        return cls(value["digest"], value["bytes"], value["device"])


class SpillFiles:
    """The files of one run's store under ``folder`` (the run's ``<checkpoints>/client-state``; a temporary
    folder, made at the first write, when it is None), and which of them are still named."""

    def __init__(self, folder: Optional[Path] = None):
        self.folder = folder
        self._live: Counter = Counter()                 # digest -> clients whose entry it holds
        self._pinned: Dict[int, FrozenSet[str]] = {}    # checkpoint round -> the digests it names
        self._cleanup = None
        self.written = 0     # files written, and read back, over the run (benchmarks/scale.py reads them)
        self.read_back = 0

    def write(self, tensors: Mapping[str, torch.Tensor]) -> SpillRecord:
        """Write ``tensors`` to the file named by their bytes' SHA-256 (the same bytes, the same file, put anew).

        Streamed: safetensors writes from the tensors' own memory into a temporary file, which is hashed in
        chunks and renamed. A model-sized ``bytes`` of the file is never made (spilling is what happens
        when memory is short; two copies of a client's state at that moment would be the run's peak)."""
        from safetensors import SafetensorError
        from safetensors.torch import save_file
        if not tensors:
            raise ValueError("nothing to spill")
        device = str(next(iter(tensors.values())).device)
        seen = set()
        plain = {}
        for name, tensor in tensors.items():
            tensor = tensor.detach().contiguous()
            # safetensors refuses two entries on one storage: a second view is written as a copy.
            pointer = (tensor.untyped_storage().data_ptr(), tensor.device)
            plain[name] = tensor.clone() if pointer in seen and tensor.numel() else tensor
            seen.add(pointer)
        folder = self._folder()
        try:
            os.makedirs(folder, exist_ok=True)
            tmp = create_temp_file(folder, ".spill.")  # a dot-name: close() removes one a crash left
            try:
                # safetensors puts a file of its own, mode 0600, in tmp's place: give it back the mode the
                # umask gave tmp, so that spilled state is as readable as the checkpoint naming it.
                mode = stat.S_IMODE(os.stat(tmp).st_mode)
                save_file(plain, tmp)
                os.chmod(tmp, mode)
                digest, nbytes = _sha256_of(Path(tmp))
                path = folder / f"{digest}.safetensors"
                if path.is_dir():
                    raise StoreError(f"{path} is a folder, where the client-state store keeps a client's state; "
                                     f"move it away")
                # Replaced even when a file of this name is there: that one may have been altered since it
                # was written (a refused checkpoint's), and these bytes are known to hash to the name.
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)
        except (OSError, SafetensorError) as err:
            raise StoreError(f"--state_memory: cannot write a client's state to {folder} "
                             f"({getattr(err, 'strerror', None) or err}); free space there, or raise --state_memory",
                             resumable=True) from None
        self._live[digest] += 1
        self.written += 1
        return SpillRecord(digest, nbytes, device)

    def read(self, record: SpillRecord) -> Tensors:
        """The tensors of ``record``'s file, checked against its name, on their device."""
        from safetensors.torch import load_file
        path = self.path_of(record)
        problem = self.problem(record)
        if problem:
            raise StoreError(problem)
        tensors = load_file(path)
        self.read_back += 1
        if record.device != "cpu":
            tensors = {name: t.to(record.device) for name, t in tensors.items()}
        return tensors

    def released(self, record: SpillRecord) -> None:
        """No client's entry is in ``record``'s file any more: it goes unless another or a kept checkpoint names it."""
        self._live[record.digest] -= 1
        if self._live[record.digest] <= 0:
            del self._live[record.digest]
            self._remove_unnamed({record.digest})

    def path_of(self, record: SpillRecord) -> Path:
        return self._folder() / f"{record.digest}.safetensors"

    def problem(self, record: SpillRecord) -> Optional[str]:
        """Why ``record``'s file cannot be read back (missing, truncated or altered), or None."""
        path = self.path_of(record)
        try:
            digest, nbytes = _sha256_of(path)
        except OSError as err:
            return f"client state file {path} cannot be read ({err.strerror or err})"
        if nbytes != record.nbytes or digest != record.digest:
            return f"client state file {path} is truncated or altered (its SHA-256 is not its name)"
        return None

    def adopted(self, record: SpillRecord) -> None:
        """A client's entry is in ``record``'s file again (a checkpoint restored it): the file is named."""
        self._live[record.digest] += 1

    def pin(self, rnd: int, kept: int) -> None:
        """A checkpoint of round ``rnd`` names the files spilled clients hold now: keep them while it is
        kept (the newest ``kept`` checkpoints are, as the run prunes them); free files nobody names."""
        self._pinned = {r: d for r, d in self._pinned.items() if r < rnd}
        self._pinned[rnd] = frozenset(self._live)
        for old in sorted(self._pinned)[:-kept]:
            del self._pinned[old]
        if self.folder is not None and self.folder.is_dir():
            self._remove_unnamed({p.name[:64] for p in self.folder.iterdir() if _FILE.fullmatch(p.name)})

    def close(self, keep_checkpointed: bool) -> None:
        """The run ended: remove every file, or (``keep_checkpointed``) all but those a kept checkpoint names."""
        if self._cleanup is not None:
            self._cleanup()
            return
        if self.folder is None or not self.folder.is_dir():
            return
        keep = set().union(*self._pinned.values()) if keep_checkpointed and self._pinned else set()
        for path in self.folder.iterdir():
            if _FILE.fullmatch(path.name) and path.name[:64] not in keep or path.name.startswith("."):
                _remove_file(path)
        try:
            self.folder.rmdir()
        except OSError:  # files a checkpoint names are kept with it
            pass

    def _remove_unnamed(self, digests) -> None:
        named = set(self._live).union(*self._pinned.values())
        for digest in set(digests) - named:
            _remove_file(self._folder() / f"{digest}.safetensors")

    def _folder(self) -> Path:
        """The store's folder (made by the first write); a temporary one when the run set none."""
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="client-state-"))
            self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.folder), True)
        return self.folder


def _sha256_of(path: Path, chunk: int = 1 << 20) -> "tuple[str, int]":
    """The SHA-256 (hex) and size of the file at ``path``, read a chunk at a time."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as file:
        while block := file.read(chunk):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size


def _remove_file(path: Path) -> None:
    """Remove the file at ``path``, if any. A folder there is not the store's (it never makes one): it stays."""
    if not path.is_dir():
        path.unlink(missing_ok=True)
