"""What an ``.npz`` may make NumPy allocate, checked before anything is loaded.

``np.load`` allocates the array a member's ``.npy`` header describes, then fills it; the header, and the
size a zip entry declares, are whatever the file says. :func:`check_npz` therefore compares each header's
claim with the bytes the member really holds: for a stored member, the bytes the entry occupies in the file;
for a compressed one, the bytes it inflates to, counted without keeping them (and never more than
:data:`DEFLATE_MAX_RATIO` times its compressed size, deflate's own bound). A caller that knows what a file
should hold (a client file and its ``config.json``) also passes the most bytes each array may take.
"""
from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Dict, Mapping, Optional, Tuple

import numpy as np

# Deflate cannot inflate one byte into more than about 1032: a member claiming more is not what it says.
DEFLATE_MAX_RATIO = 1032
# Bytes inflated at a time while a compressed member is measured.
CHUNK = 1 << 20
_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}

Header = Tuple[Tuple[int, ...], np.dtype]


class NpzLimitError(ValueError):
    """A member of an ``.npz`` claims more than it holds, or more than its caller allows; the message says which."""


def check_npz(path: Path, limits: Optional[Mapping[str, int]] = None) -> Dict[str, Header]:
    """Each ``.npy`` member's (shape, dtype) by key, once every header is found to claim no more bytes than
    its member holds and, for a key in ``limits``, no more than ``limits[key]``. Raises
    :class:`NpzLimitError`, or ``zipfile.BadZipFile`` / ``OSError`` for a file that is not a readable zip."""
    path = Path(path)
    disk_size = path.stat().st_size
    headers: Dict[str, Header] = {}
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if not info.filename.endswith(".npy"):
                continue
            key = info.filename[:-len(".npy")]
            if info.compress_size > disk_size:
                raise NpzLimitError(f"{path}: member {info.filename} claims {info.compress_size} bytes in a file of "
                                    f"{disk_size}; the file is truncated or corrupt")
            with archive.open(info) as member:
                shape, dtype, header_size = _read_header(member, path, info.filename)
                claimed = int(np.prod(shape, dtype=object)) * dtype.itemsize
                limit = None if limits is None else limits.get(key)
                if limit is not None and claimed > limit:
                    raise NpzLimitError(f"{path}: {key} claims an array of shape {shape} and dtype {dtype} ({claimed} "
                                        f"bytes), more than config.json allows it ({limit} bytes); the file is "
                                        f"corrupt or not this dataset's")
                held = _bytes_after_header(member, info, header_size, claimed)
            if not dtype.hasobject and claimed > held:
                raise NpzLimitError(f"{path}: member {info.filename} claims an array of shape {shape} and dtype "
                                    f"{dtype} ({claimed} bytes) but holds {held} bytes; the file is truncated or "
                                    f"corrupt")
            headers[key] = (shape, dtype)
    return headers


def _read_header(member, path: Path, name: str) -> Tuple[Tuple[int, ...], np.dtype, int]:
    """(shape, dtype, bytes the magic string and header take) of the ``.npy`` member open as ``member``."""
    version = np.lib.format.read_magic(member)
    read_header = _HEADER_READERS.get(version)
    if read_header is None:
        raise NpzLimitError(f"{path}: member {name} has .npy format version {version}, expected 1.0 or 2.0; the "
                            f"file is corrupt")
    shape, _, dtype = read_header(member)
    return shape, dtype, member.tell()


def _bytes_after_header(member, info: zipfile.ZipInfo, header_size: int, claimed: int) -> int:
    """How many bytes the member holds after its header: read off the zip entry for a stored member; counted
    by inflating a compressed one, stopping once past ``claimed`` (or deflate's bound), so that a member
    that inflates to gigabytes is measured in constant memory and no further than it must be."""
    if info.compress_type == zipfile.ZIP_STORED:
        return min(info.compress_size, info.file_size) - header_size
    stop = min(claimed, info.compress_size * DEFLATE_MAX_RATIO) + 1
    held = 0
    while held < stop:
        chunk = member.read(min(CHUNK, stop - held))
        if not chunk:
            break
        held += len(chunk)
    return held
