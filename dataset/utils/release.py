"""A dataset's public release: downloaded once into ``rawdata/``, then read from its archive or folder.

The generators that download (AG News, Sogou News, HAR, PAMAP2) share two rules, kept here: a file gets
its final name only once it is complete and checked, so a file found under that name is reused instead
of downloaded again; and a failed download removes what it wrote and names ``--source``, the offline
way. :class:`ReleaseFiles` reads a release's files the same way from its ``.zip`` as from the folder
the zip extracts to, so a user may pass either and the download need not be extracted.
"""
from __future__ import annotations

import io
import urllib.request
import warnings
import zipfile
import zlib
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Callable, Iterator, List, Optional, TextIO
from urllib.parse import unquote

import numpy as np

from dataset.utils.client_files import DatasetFileError
from dataset.utils.one_line import error_reason, shortened
from dataset.utils.raw_data import DownloadError, removed_on_failure

# What is wrong with a downloaded file (None when nothing is).
FileCheck = Callable[[Path], Optional[str]]

# macOS archivers add resource forks under this folder; they are never the release's files.
_MAC_METADATA = "__MACOSX/"


@contextmanager
def downloading(what: str, raw_dir: Path, offline: str) -> Iterator[Path]:
    """Around the downloads of ``what`` into ``raw_dir`` (created): on failure, what they wrote is
    removed, and a network or disk error becomes :class:`DownloadError` ending ``pass --source to
    <offline>``."""
    raw_dir = Path(raw_dir)
    try:
        with removed_on_failure(raw_dir):
            raw_dir.mkdir(parents=True, exist_ok=True)
            yield raw_dir
    except OSError as err:
        reason = error_reason(err)
        raise DownloadError(f"could not download {what} ({reason}); pass --source to {offline}") from None


def fetch(url: str, target: Path, check: FileCheck, offline: str) -> Path:
    """``target``, downloaded from ``url`` unless a file that passes ``check`` is already there.

    The download goes to ``<target>.part`` and is renamed only once ``check`` accepts it, so an
    interrupted or corrupt download never passes for the real file."""
    target = Path(target)
    if target.is_file() and check(target) is None:
        return target
    incoming = target.with_name(target.name + ".part")
    urllib.request.urlretrieve(url, incoming)
    problem = check(incoming)
    if problem is not None:
        raise DownloadError(f"{url} {problem}; pass --source to {offline}")
    incoming.replace(target)
    return target


class ReleaseFiles:
    """A release's files by their path below its top folder, from its ``.zip`` or its extracted folder.

    The top folder is found by ``marker``, a path every copy of the release holds (``Protocol/``): the
    folder given, or one folder inside it (``rawdata/`` holding ``PAMAP2_Dataset/``); in a zip, the
    members' common prefix before the marker. ``what`` describes the release in error messages.
    """

    def __init__(self, source: Path, marker: str, what: str):
        self.source = Path(source)
        self.what = what
        self.top: Optional[Path] = None  # the release's top folder, when read from a folder
        self.prefix = ""  # the members' path before the top folder's contents, when read from a zip
        if self.source.is_dir():
            self.top = self._top_folder(marker)
        elif self.source.is_file():
            self.prefix = self._zip_prefix(marker)
        else:
            raise FileNotFoundError(f"--source {self.source} does not exist")

    def _top_folder(self, marker: str) -> Path:
        candidates = [self.source] + sorted(p for p in self.source.iterdir() if p.is_dir())
        for folder in candidates:
            if (folder / marker).exists():
                return folder
        raise FileNotFoundError(f"--source folder {self.source} holds no {marker}; expected {self.what}")

    def _zip_prefix(self, marker: str) -> str:
        try:
            with zipfile.ZipFile(self.source) as archive:
                names = [n for n in archive.namelist() if not n.startswith(_MAC_METADATA)]
        except (zipfile.BadZipFile, OSError) as err:
            raise DatasetFileError(f"{self.source} is not a readable .zip archive ({err}); "
                                   f"expected {self.what}") from None
        prefixes = [("" if n.startswith(marker) else n[:n.index(f"/{marker}") + 1]) for n in names
                    if n.startswith(marker) or f"/{marker}" in n]
        if not prefixes:
            raise DatasetFileError(f"{self.source} holds no {marker}; expected {self.what}")
        return min(prefixes, key=len)

    def names(self, folder: str) -> List[str]:
        """The names of the files directly in ``folder`` (a path below the top), sorted."""
        if self.top is not None:
            return sorted(p.name for p in (self.top / folder).iterdir() if p.is_file())
        start = f"{self.prefix}{folder.rstrip('/')}/"
        with zipfile.ZipFile(self.source) as archive:
            rest = [n[len(start):] for n in archive.namelist() if n.startswith(start)]
        return sorted(name for name in rest if name and "/" not in name)

    def where(self, relative: str) -> str:
        """How messages name one file: its path, or the zip and the member."""
        return str(self.top / relative) if self.top is not None else f"{self.source}: {self.prefix}{relative}"

    @contextmanager
    def open(self, relative: str) -> Iterator[TextIO]:
        """One file as text. Latin-1 decodes any byte, so a stray one shows up as a value that is not a
        number, in the parser's message, rather than as a decoding error."""
        if self.top is not None:
            path = self.top / relative
            if not path.is_file():
                raise FileNotFoundError(f"--source folder {self.source} lacks {relative}; expected {self.what}")
            with open(path, encoding="latin-1") as fh:
                yield fh
            return
        with zipfile.ZipFile(self.source) as archive:
            try:
                member = archive.open(self.prefix + relative)
            except KeyError:
                raise FileNotFoundError(f"{self.source} lacks {self.prefix}{relative}; expected {self.what}") from None
            try:
                with io.TextIOWrapper(member, encoding="latin-1") as fh:
                    yield fh
            except (zipfile.BadZipFile, zlib.error, EOFError) as err:
                raise DatasetFileError(f"{self.where(relative)} is damaged in the archive ({err}); "
                                       f"expected {self.what}") from None

    def read_table(self, relative: str, dtype=np.float64) -> np.ndarray:
        """A file of whitespace-separated numbers as a 2-D array (one row per line; ``NaN`` allowed).
        An empty file is refused here, so callers never meet a table without rows."""
        with self.open(relative) as fh, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # NumPy's "input contained no data": refused below
            try:
                table = np.loadtxt(fh, dtype=dtype, ndmin=2)
            except ValueError as err:
                reason = shortened(str(err).splitlines()[0])
                raise DatasetFileError(f"{self.where(relative)} is not a table of numbers ({reason}); "
                                       f"expected {self.what}") from None
        if not table.size:
            raise DatasetFileError(f"{self.where(relative)} holds no rows; expected {self.what}")
        return table


def release_problem(path: Path, marker: str) -> Optional[str]:
    """A :data:`FileCheck` for a downloaded ``.zip``: None when it opens and holds ``marker``."""
    try:
        ReleaseFiles(path, marker, "the release")
    except DatasetFileError:
        return f"gave a file that is not a .zip archive holding {marker}"
    return None


def download_zip(url: str, raw_dir: Path, marker: str, what: str, offline: str) -> Path:
    """The release's ``.zip`` in ``raw_dir``: reused when one that holds ``marker`` is there, else
    downloaded (and checked the same way: UCI publishes no checksums). Read in place, never extracted."""
    with downloading(what, raw_dir, offline) as folder:
        return fetch(url, folder / unquote(url.rsplit("/", 1)[-1]), partial(release_problem, marker=marker), offline)
