"""What a split was built from: the generator's ``--source``, known by a digest of the arrays read from it.

The same options over two different files give two different splits, so the data belongs to a split's
identity as much as its partition does. ``config.json`` records ``source_sha256``, the
:func:`~dataset.utils.client_files.content_hash` of the arrays the split was cut from (images, labels: dtype,
shape and values, as the generator hands them to the partition), and ``source_file``, the ``--source`` as
given (null for the published data: a download, or Digits' embedded images).

The arrays rather than the file's bytes, because the arrays are what makes the split: a release's zip and
its unpacked folder, or an ``.npz`` saved again, are the same source. It costs reading the source before
the folder is compared, so a rebuild from the same ``--source`` reads it once (seconds for an ``.npz``)
before saying there is nothing to do. Without ``--source`` the folder is compared before anything is
downloaded, as always: it then holds the split asked for unless it was built from a ``--source``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Mapping, Optional, Union

import numpy as np

from dataset.utils.client_files import content_hash

# Hex digits of a digest shown in messages (config.json keeps all 64).
SHOWN = 12
# config.json keys (see the module docstring).
FILE_KEY = "source_file"
DIGEST_KEY = "source_sha256"
# What a split built without --source comes from: the generator's download, or its embedded data.
PUBLISHED = "the published data, no --source"


@dataclass(frozen=True)
class SourceDigest:
    """The data a split is cut from: the ``--source`` as given (None: the published data) and the SHA-256
    of its arrays (hex)."""
    file: Optional[str]
    sha256: str

    def __str__(self) -> str:
        return f"{self.file or 'the published data'} sha256:{self.sha256[:SHOWN]}"


def source_digest(source: Optional[Union[str, Path]], x: np.ndarray, y: np.ndarray) -> SourceDigest:
    """The :class:`SourceDigest` of arrays ``x``, ``y`` read from ``source`` (None: downloaded or embedded)."""
    return SourceDigest(None if source is None else str(source), content_hash(x, y))


def source_entries(source: SourceDigest) -> dict:
    """The ``config.json`` entries recording ``source``."""
    return {FILE_KEY: source.file, DIGEST_KEY: source.sha256}


def predates_digests(config: Mapping, source: Optional[SourceDigest]) -> bool:
    """True when ``source`` was read from a ``--source`` but ``config`` was written before sources were
    recorded: which data the folder was built from is unknown. (Asked for the published data, such a
    folder is taken as it is, as it always was.)"""
    return source is not None and source.file is not None and DIGEST_KEY not in config


def source_differences(config: Mapping, source: Optional[SourceDigest]) -> List[str]:
    """``["source <recorded> (asked <source>)"]`` when ``config`` was built from other data than ``source``,
    else ``[]``. ``source`` None asks for the published data before it is read: any folder not built from a
    ``--source`` holds it. See :func:`predates_digests` for a config that records no source."""
    if DIGEST_KEY not in config:
        return []
    recorded_file, recorded = config.get(FILE_KEY), config.get(DIGEST_KEY)
    same = recorded_file is None if source is None else recorded == source.sha256
    if same:
        return []
    built = SourceDigest(recorded_file, str(recorded)) if recorded else PUBLISHED
    return [f"source {built} (asked {source or PUBLISHED})"]
