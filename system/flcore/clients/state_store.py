"""The client-state store: the one table of what each client owns, by client id, kept in memory up to a
budget (``--state_memory``), the least recently used clients' entries beyond it in files
(:mod:`flcore.clients.spill_files`), read back when asked for.

A parked client (:mod:`flcore.clients.parking`) keeps only references to tensors other clients share too
(the round's broadcast, the initial model) and the structure of its modules; what is its own alone (a
personal model, a head, control variates) is an entry of this table, ``{key: tensor}`` with keys
``module/<slot>/<name>`` and ``attr/<attribute>[/<key>]``. For FedAvg that is nothing; for Ditto, Local,
APFL, pFedMe, SCAFFOLD ... it is a model's worth or more per client, which thousands of clients cannot all
keep in memory. A client puts its entry in when it is parked (most recent last) and takes it out when it is
used; while the entries in memory are over the budget, the least recently used one goes to a file and
leaves shape-only (``meta``) stand-ins. A client whose upload is pending keeps in memory what the upload
holds (spilling it would free nothing); the rest of its entry may go to a file until the round ends. The
table never calls a client: it holds values. Spilling never changes a value: results are the same with any
budget.
"""
from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import AbstractSet, Dict, FrozenSet, Iterable, Mapping, Optional, Tuple

import torch

from flcore.clients.spill_files import SpillFiles, SpillRecord, StoreError, Tensors
from utils.memory_release import release_free_memory
from utils.sizes import format_size

# Spilled bytes after which the freed memory is given back to the system (about a ResNet-18's worth).
TRIM_AFTER_BYTES = 32 << 20


class ClientStateStore:
    """The table of one run (see the module docstring). ``budget``: bytes of entries kept in memory (None: no
    limit). ``folder``: where spilled files go (:class:`~flcore.clients.spill_files.SpillFiles`)."""

    def __init__(self, budget: Optional[int] = None, folder: Optional[Path] = None):
        self.budget = budget
        self.files = SpillFiles(folder)
        self._memory: "OrderedDict[int, Tensors]" = OrderedDict()  # client id -> its entry, least recent first
        self._nbytes: Dict[int, int] = {}                             # client id -> bytes of its entry in memory
        self._files: Dict[int, SpillRecord] = {}                      # client id -> the file its entry is in
        self.resident_bytes = 0
        self._uploading: set = set()  # ids of clients whose tensors the round's uploads hold
        # Of those, the ones whose update told which of their keys it holds: the rest of the entry may spill
        # while the upload is pending (SCAFFOLD's c_i beside the trained model the upload holds).
        self._held: Dict[int, FrozenSet[str]] = {}
        self._spilled_since_trim = 0

    # ----- the table ----------------------------------------------------------------------------
    def put(self, client_id: int, tensors: Mapping[str, torch.Tensor], used: bool = True) -> None:
        """Client ``client_id`` owns ``tensors`` now (its entry, replacing any it had): as the most recently
        used when ``used``, else (a recount after a broadcast) in its place. The least recently used entries
        go to files while the total is over the budget."""
        record = self._files.pop(client_id, None)
        if record is not None:
            self.files.released(record)
        self.resident_bytes -= self._nbytes.pop(client_id, 0)
        self._held.pop(client_id, None)  # what its upload holds is known again only when the client says so
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
        return self.spilled_bytes(client_id) + self._nbytes.get(client_id, 0)

    def is_spilled(self, client_id: int) -> bool:
        return client_id in self._files

    def adopt(self, client_id: int, record: SpillRecord, stand_ins: Mapping[str, torch.Tensor]) -> None:
        """Client ``client_id``'s entry, as a checkpoint saved it, is in ``record``'s file (checked already);
        ``stand_ins``: its keys, shape-only, until it is read back."""
        self._drop(client_id)
        self._memory[client_id] = dict(stand_ins)
        self._memory.move_to_end(client_id, last=False)  # not used since: the first to go again
        self._files[client_id] = record
        self.files.adopted(record)

    def make_room(self, nbytes: int, keep: Optional[int] = None) -> None:
        """Spill the least recently used entries (never client ``keep``'s) until ``nbytes`` more fit in the
        budget: a client about to copy or read back tensors makes room first, so the table never holds more."""
        if self.budget is None or self.resident_bytes + nbytes <= self.budget:
            return
        # Least recent first. A client whose tensors this round's uploads hold stays: spilling it would write a
        # file and free nothing until the server has aggregated. Only then the parts of such entries that no
        # upload holds go, the least recent first; they come back when the round's uploads are gone.
        while self.resident_bytes + nbytes > self.budget:
            victim = next((cid for cid in self._memory if cid not in self._files and cid not in self._uploading
                           and cid != keep), None)
            if victim is not None:
                self._spill(victim)
                continue
            pending = next((cid for cid in self._memory if cid in self._held and cid not in self._files
                            and cid != keep and self._held[cid] != frozenset(self._memory[cid])), None)
            if pending is None:
                break
            self._spill(pending, keys=frozenset(self._memory[pending]) - self._held[pending])
        # What the victims held was freed among live blocks, where glibc keeps it (utils/memory_release.py).
        # A trim walks the whole heap, so it waits until a sizeable amount was freed.
        if self._spilled_since_trim >= TRIM_AFTER_BYTES:
            release_free_memory()
            self._spilled_since_trim = 0

    def uploading(self, client_ids) -> None:
        """Clients ``client_ids`` are about to train: their uploads will hold their tensors until :meth:`uploaded`."""
        self._uploading.update(client_ids)

    def held_by_upload(self, client_id: int, tensors: Iterable[torch.Tensor]) -> None:
        """Client ``client_id``'s upload holds ``tensors``: the keys of its entry on other storages may spill
        before the round's uploads are gone. Clients that never say so keep their whole entry in memory until
        then; without a budget nothing spills, so nothing is noted."""
        if self.budget is None or client_id not in self._uploading or client_id in self._files:
            return
        storages = {t.untyped_storage().data_ptr() for t in tensors}
        entry = self._memory.get(client_id, {})
        self._held[client_id] = frozenset(key for key, t in entry.items()
                                          if t.untyped_storage().data_ptr() in storages)
        self.make_room(0)

    def uploading_bytes(self) -> int:
        """What the round's uploads keep in memory beyond the budget: of each client whose upload said what it
        holds, those tensors; of every other client whose upload is pending, its whole entry in memory."""
        total = 0
        for cid in self._uploading:
            held = self._held.get(cid)
            entry = self._memory.get(cid, {})
            total += (self._nbytes.get(cid, 0) if held is None
                      else _nbytes({key: t for key, t in entry.items() if key in held}))
        return total

    def spilled_bytes(self, client_id: int) -> int:
        """Bytes of client ``client_id``'s entry in its file (0 when none is)."""
        record = self._files.get(client_id)
        return record.nbytes if record is not None else 0

    def uploaded(self) -> None:
        """The round's uploads are gone (aggregated): their clients may spill again, whole. An entry that spilled
        in part while its upload was pending is made whole again, least recent first (one file per entry, as
        checkpoints name it): read back where the budget takes it, else written to one file with the rest."""
        partly = [cid for cid in self._memory
                  if cid in self._held and cid in self._files and self._nbytes.get(cid, 0)]
        self._uploading.clear()
        self._held.clear()
        for client_id in partly:  # least recent first
            nbytes = self._files[client_id].nbytes
            self.make_room(nbytes, keep=client_id)
            if self.resident_bytes + nbytes <= self.budget:  # a budget: nothing spills in part without one
                self._read_back(client_id, room_made=True)
            else:
                self._spill_rest(client_id)

    def _spill(self, client_id: int, keys: Optional[AbstractSet[str]] = None) -> None:
        """Client ``client_id``'s entry to a file: all of it, or only ``keys`` (the rest stays in memory)."""
        entry = self._memory[client_id]
        going = {key: t for key, t in entry.items() if keys is None or key in keys}
        record = self.files.write(going)
        self._memory[client_id] = {key: t.to("meta") if key in going else t for key, t in entry.items()}
        self._files[client_id] = record
        staying = _nbytes({key: t for key, t in entry.items() if key not in going})
        spilled = self._nbytes.pop(client_id) - staying
        if staying:
            self._nbytes[client_id] = staying
        self.resident_bytes -= spilled
        self._spilled_since_trim += spilled

    def _spill_rest(self, client_id: int) -> None:
        """A client whose entry spilled in part spills the rest: its file is read and the whole entry written to
        one file (only the part that was in the file passes through memory, beyond the budget for that while)."""
        self._read_back(client_id, room_made=True)
        self._spill(client_id)

    def _read_back(self, client_id: int, room_made: bool = False) -> None:
        """Client ``client_id``'s entry back from its file, room made first unless the caller made it (or, to
        spill the whole entry at once, needs none)."""
        record = self._files[client_id]
        if not room_made:
            self.make_room(record.nbytes, keep=client_id)
        tensors = self.files.read(record)
        # The stand-ins come back from the file; an entry a checkpoint restored may also hold tensors it saved
        # in full (what the client held by reference then, its own now), which stay.
        self._memory[client_id] = {key: tensors[key] if value.device.type == "meta" else value
                                   for key, value in self._memory[client_id].items()}
        del self._files[client_id]
        self.resident_bytes -= self._nbytes.get(client_id, 0)  # the part that stayed, counted again below
        self._nbytes[client_id] = _nbytes(self._memory[client_id])
        self.resident_bytes += self._nbytes[client_id]
        self.files.released(record)

    def _drop(self, client_id: int) -> None:
        """Client ``client_id``'s entry leaves the table (its file, if any, is no longer named by it)."""
        self._memory.pop(client_id, None)
        self.resident_bytes -= self._nbytes.pop(client_id, 0)
        self._held.pop(client_id, None)
        record = self._files.pop(client_id, None)
        if record is not None:
            self.files.released(record)


def _nbytes(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())
