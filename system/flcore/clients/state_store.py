"""The client-state store: the one table of what each client owns, by client id, kept in memory up to a
budget (``--state_memory``), the least recently used clients' entries beyond it in files under the run's
folder, read back when asked for.

A parked client (:mod:`flcore.clients.parking`) keeps only references to tensors other clients share too
(the round's broadcast, the initial model) and the structure of its modules; what is its own alone (a
personal model, a head, control variates) is an entry of this table, ``{key: tensor}`` with keys
``module/<slot>/<name>`` and ``attr/<attribute>[/<key>]``. For FedAvg that is nothing; for Ditto, Local,
APFL, pFedMe, SCAFFOLD ... it is a model's worth or more per client, which thousands of clients cannot all
keep in memory. A client puts its entry in when it is parked (most recent last) and takes it out when it is
used; while the entries in memory are over the budget, the least recently used one goes to a file and
leaves shape-only (``meta``) stand-ins. The table never calls a client: it holds values. Spilling never
changes a value: results are the same with any budget.

Files are safetensors (tensors only: nothing is executed to load them), named by the SHA-256 of their
bytes, written atomically and never changed; their mode follows the umask, as the checkpoints beside them
do. A file whose bytes do not hash to its name was truncated or altered; it is named and refused, and a
spill of the same bytes puts a good file in its place. A checkpoint records which file holds each spilled
client's entry (shared tensors are saved once, own ones once: not one model copy per client), and the
store keeps every file a kept checkpoint names until the checkpoint goes. A folder at a file's name is not
the store's: it is left alone, and a spill that needs the name stops the run saying so.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import tempfile
import weakref
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, FrozenSet, Mapping, Optional, Tuple

import torch

from dataset.utils.atomic_io import create_temp_file
from utils.memory_release import release_free_memory
from utils.sizes import format_size

Tensors = Dict[str, torch.Tensor]
_FILE = re.compile(r"[0-9a-f]{64}\.safetensors")
# Spilled bytes after which the freed memory is given back to the system (about a ResNet-18's worth).
TRIM_AFTER_BYTES = 32 << 20


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


class ClientStateStore:
    """The table of one run (see the module docstring). ``budget``: bytes of entries kept in memory (None: no
    limit). ``folder``: where spilled files go (the run's ``<checkpoints>/client-state``); a temporary folder
    is made at the first spill when it is None."""

    def __init__(self, budget: Optional[int] = None, folder: Optional[Path] = None):
        self.budget = budget
        self.folder = folder
        self._memory: "OrderedDict[int, Tensors]" = OrderedDict()  # client id -> its entry, least recent first
        self._nbytes: Dict[int, int] = {}                             # client id -> bytes of its entry in memory
        self._files: Dict[int, SpillRecord] = {}                      # client id -> the file its entry is in
        self.resident_bytes = 0
        self._uploading: set = set()  # ids of clients whose tensors the round's uploads hold
        self._live: Counter = Counter()                 # digest -> spilled clients whose entry it holds
        self._pinned: Dict[int, FrozenSet[str]] = {}    # checkpoint round -> the digests it names
        self._cleanup = None
        self._spilled_since_trim = 0
        self.spilled_files = 0   # files written, and read back, over the run (benchmarks/scale.py reads them)
        self.read_files = 0

    # ----- the table ----------------------------------------------------------------------------
    def put(self, client_id: int, tensors: Mapping[str, torch.Tensor], used: bool = True) -> None:
        """Client ``client_id`` owns ``tensors`` now (its entry, replacing any it had): as the most recently
        used when ``used``, else (a recount after a broadcast) in its place. The least recently used entries
        go to files while the total is over the budget."""
        record = self._files.pop(client_id, None)
        if record is not None:
            self.released(record)
        self.resident_bytes -= self._nbytes.pop(client_id, 0)
        if not tensors:
            self._memory.pop(client_id, None)
            return
        owned = _nbytes(tensors)
        if self.budget is not None and owned > self.budget:
            self._memory.pop(client_id, None)
            raise StoreError(f"--state_memory {format_size(self.budget)} cannot hold one client's own state "
                             f"(client {client_id} keeps {format_size(owned)}); raise --state_memory")
        self._memory[client_id] = dict(tensors)  # a recount keeps the entry's place; a new one comes last
        if used:
            self._memory.move_to_end(client_id)
        self._nbytes[client_id] = owned
        self.resident_bytes += owned
        self.make_room(0)

    def get(self, client_id: int) -> Tensors:
        """Client ``client_id``'s entry ({} when it owns nothing), read back from its file if spilled (room is
        made first); it stays in the table, in its place."""
        if client_id in self._files:
            self._read_back(client_id)
        return dict(self._memory.get(client_id, {}))

    def take(self, client_id: int) -> Tensors:
        """:meth:`get`, and the entry leaves the table: the client holds it while in use, and puts it back
        when parked (a client in use is never spilled: it is not in the table)."""
        tensors = self.get(client_id)
        self._drop(client_id)
        return tensors

    def peek(self, client_id: int) -> Tuple[Tensors, Optional[SpillRecord]]:
        """The entry as it is, nothing read back: its tensors, or, when spilled, shape-only stand-ins of them and
        the file's record (what a checkpoint saves: the file's name, not a copy)."""
        record = self._files.get(client_id)
        if record is None:
            return dict(self._memory.get(client_id, {})), None
        return dict(self._memory[client_id]), record

    def keys(self, client_id: int) -> FrozenSet[str]:
        """The keys of client ``client_id``'s entry (nothing read back)."""
        return frozenset(self._memory.get(client_id, ()))

    def owned_bytes(self, client_id: int) -> int:
        """Bytes of client ``client_id``'s entry, in memory or in its file."""
        record = self._files.get(client_id)
        return record.nbytes if record is not None else self._nbytes.get(client_id, 0)

    def is_spilled(self, client_id: int) -> bool:
        return client_id in self._files

    def adopt(self, client_id: int, record: SpillRecord, stand_ins: Mapping[str, torch.Tensor]) -> None:
        """Client ``client_id``'s entry, as a checkpoint saved it, is in ``record``'s file (checked already);
        ``stand_ins``: its keys, shape-only, until it is read back."""
        self._drop(client_id)
        self._memory[client_id] = dict(stand_ins)
        self._memory.move_to_end(client_id, last=False)  # not used since: the first to go again
        self._files[client_id] = record
        self._live[record.digest] += 1

    def make_room(self, nbytes: int, keep: Optional[int] = None) -> None:
        """Spill the least recently used entries (never client ``keep``'s) until ``nbytes`` more fit in the
        budget: a client about to copy or read back tensors makes room first, so the table never holds more."""
        if self.budget is None or self.resident_bytes + nbytes <= self.budget:
            return
        # Least recent first. A client whose tensors this round's uploads hold stays: spilling it would write a
        # file and free nothing until the server has aggregated.
        while self.resident_bytes + nbytes > self.budget:
            victim = next((cid for cid in self._memory if cid not in self._files and cid not in self._uploading
                           and cid != keep), None)
            if victim is None:
                break
            self._spill(victim)
        # What the victims held was freed among live blocks, where glibc keeps it (utils/memory_release.py).
        # A trim walks the whole heap, so it waits until a sizeable amount was freed.
        if self._spilled_since_trim >= TRIM_AFTER_BYTES:
            release_free_memory()
            self._spilled_since_trim = 0

    def uploading(self, client_ids) -> None:
        """Clients ``client_ids`` are about to train: their uploads will hold their tensors until :meth:`uploaded`."""
        self._uploading.update(client_ids)

    def uploading_bytes(self) -> int:
        """What the clients whose tensors the round's uploads hold own in memory (never spilled)."""
        return sum(self._nbytes.get(cid, 0) for cid in self._uploading if cid not in self._files)

    def uploaded(self) -> None:
        """The round's uploads are gone (aggregated): their clients may spill again."""
        self._uploading.clear()

    def _spill(self, client_id: int) -> None:
        tensors = self._memory[client_id]
        record = self.write(tensors)
        self._memory[client_id] = {key: t.to("meta") for key, t in tensors.items()}
        self._files[client_id] = record
        spilled = self._nbytes.pop(client_id)
        self.resident_bytes -= spilled
        self._spilled_since_trim += spilled

    def _read_back(self, client_id: int) -> None:
        record = self._files[client_id]
        self.make_room(record.nbytes, keep=client_id)
        tensors = self.read(record)
        # The stand-ins come back from the file; an entry a checkpoint restored may also hold tensors it saved
        # in full (what the client held by reference then, its own now), which stay.
        self._memory[client_id] = {key: tensors[key] if value.device.type == "meta" else value
                                   for key, value in self._memory[client_id].items()}
        del self._files[client_id]
        self._nbytes[client_id] = _nbytes(self._memory[client_id])
        self.resident_bytes += self._nbytes[client_id]
        self.released(record)

    def _drop(self, client_id: int) -> None:
        """Client ``client_id``'s entry leaves the table (its file, if any, is no longer named by it)."""
        self._memory.pop(client_id, None)
        self.resident_bytes -= self._nbytes.pop(client_id, 0)
        record = self._files.pop(client_id, None)
        if record is not None:
            self.released(record)

    # ----- files --------------------------------------------------------------------------------
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
        self.spilled_files += 1
        return SpillRecord(digest, nbytes, device)

    def read(self, record: SpillRecord) -> Tensors:
        """The tensors of ``record``'s file, checked against its name, on their device."""
        from safetensors.torch import load_file
        path = self.path_of(record)
        problem = self.problem(record)
        if problem:
            raise StoreError(problem)
        tensors = load_file(path)
        self.read_files += 1
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

    # ----- checkpoints --------------------------------------------------------------------------
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


def _nbytes(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())
