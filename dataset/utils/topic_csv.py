"""The CSV releases of the news topic datasets (AG News, Sogou News): rows ``class index (1-K), title, body``.

Both generators read their rows, and accept the same ``--source`` forms, through this module: the
release's folder (``train.csv`` and ``test.csv``), one CSV of such rows, or a ``.npz`` already holding
token ids. The texts are encoded as ``dataset/utils/text.py`` describes, in
two passes over the files instead of one over all texts in memory: Sogou News holds 510,000 articles of
a few thousand characters, whose token lists held at once would take over ten gigabytes, while only
``max_len`` ids of each are kept. The ids are those ``text.encode_texts`` gives on all texts at once.
"""
from __future__ import annotations

import csv
import itertools
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

import numpy as np

from dataset.utils.client_files import DatasetFileError
from dataset.utils.generate import GeneratorSetting
from dataset.utils.text import RESERVED_IDS, build_vocabulary, encode, load_token_npz, token_inputs, tokenize

# The options of a topic-CSV text generator (PFLlib's -vs and -ml, as AG News and Sogou News are built).
TEXT_SETTINGS = (
    GeneratorSetting("--vocab-size", 32000, "token ids in all, 0 (padding) and 1 (unknown) included; the "
                                            "train text's most frequent tokens get the rest (PFLlib: 32000)",
                     minimum=3),
    GeneratorSetting("--max-len", 200, "tokens per text: longer texts are cut, shorter ones padded with 0"),
)

SPLIT_FILES = ("train.csv", "test.csv")
# Rows encoded at a time: their texts are the only ones held whole.
_CHUNK_ROWS = 4096
# Python's csv refuses a field above 128 KiB; some articles are longer, and are read whole instead.
_FIELD_LIMIT = 2 ** 31 - 1


@dataclass(frozen=True)
class TopicCsv:
    """One release's row form: its classes (class index ``i`` in the CSV is label ``i - 1``) and the
    names of the text columns after the class index, for messages."""
    classes: Tuple[str, ...]
    columns: str  # e.g. "title, description"

    @property
    def row_form(self) -> str:
        return f"class index (1-{len(self.classes)}), {self.columns}"


@contextmanager
def _long_fields() -> Iterator[None]:
    previous = csv.field_size_limit(_FIELD_LIMIT)
    try:
        yield
    finally:
        csv.field_size_limit(previous)


def read_rows(path: Path, release: TopicCsv) -> Iterator[Tuple[str, int]]:
    """Each row's text (its columns after the class index, joined by a space) and label, in file order.

    A row of another form stops the reading with its line number; so does a file without rows."""
    rows = 0
    with _long_fields(), open(path, encoding="utf-8", errors="replace", newline="") as fh:
        for line, row in enumerate(csv.reader(fh), start=1):
            if not row:
                continue
            index = row[0].strip()
            if len(row) < 3 or not index.isdigit() or not 1 <= int(index) <= len(release.classes):
                raise DatasetFileError(f"{path}, row {line}: expected '{release.row_form}', got {str(row)[:80]}")
            rows += 1
            yield " ".join(row[1:]), int(index) - 1
    if not rows:
        raise DatasetFileError(f"{path} holds no rows")


def encode_rows(path: Path, release: TopicCsv, vocabulary: Dict[str, int],
                max_len: int) -> Tuple[np.ndarray, np.ndarray]:
    """``(ids, labels)`` of one CSV's rows, a chunk of rows at a time."""
    ids, labels = [], []
    rows = read_rows(path, release)
    while True:
        chunk = list(itertools.islice(rows, _CHUNK_ROWS))
        if not chunk:
            break
        ids.append(encode([tokenize(text)[:max_len] for text, _ in chunk], vocabulary, max_len))
        labels.append(np.fromiter((label for _, label in chunk), dtype=np.int64, count=len(chunk)))
    return np.concatenate(ids), np.concatenate(labels)


def from_csv_files(release: TopicCsv, train_csv: Path, test_csv: Optional[Path] = None, *, vocab_size: int,
                   max_len: int) -> Tuple[np.ndarray, np.ndarray, dict]:
    """Token ids of the train rows then the test rows, their labels, and the config entries; the
    vocabulary comes from the train rows only, as a held-out split would see it."""
    vocabulary = build_vocabulary((tokenize(text) for text, _ in read_rows(train_csv, release)), vocab_size)
    parts = [encode_rows(path, release, vocabulary, max_len) for path in (train_csv, test_csv) if path is not None]
    x = np.concatenate([ids for ids, _ in parts])
    y = np.concatenate([labels for _, labels in parts])
    return x, y, token_inputs(RESERVED_IDS + len(vocabulary), max_len)


def load_source(release: TopicCsv, source: Path, *, vocab_size: int,
                max_len: int) -> Tuple[np.ndarray, np.ndarray, dict]:
    """A local copy: the release's folder, one CSV (its rows build the vocabulary) or a tokens ``.npz``."""
    source = Path(source)
    if source.is_dir():
        missing = [name for name in SPLIT_FILES if not (source / name).is_file()]
        if missing:
            raise FileNotFoundError(f"--source folder {source} lacks {' and '.join(missing)}")
        return from_csv_files(release, *(source / name for name in SPLIT_FILES), vocab_size=vocab_size,
                              max_len=max_len)
    if not source.is_file():
        raise FileNotFoundError(f"--source file {source} does not exist")
    if source.suffix == ".npz":
        return load_token_npz(source, vocab_size, max_len)
    return from_csv_files(release, source, vocab_size=vocab_size, max_len=max_len)
