"""The on-disk format of a partitioned dataset, shared by the generators and the trainer.

Layout (PFLlib's): ``dataset/<name>/config.json``, ``dataset/<name>/train/<id>.npz`` and
``dataset/<name>/test/<id>.npz`` for client ids ``0..N-1``.

Each ``.npz`` holds two plain arrays, ``x`` and ``y`` (int64, N), so it loads with
``allow_pickle=False``. What ``x`` holds is the config's ``input_kind`` (:func:`input_kind`):

* ``image`` (the default, and all PFLlib configs): float32, N x C x H x W, ``input_shape`` [C, H, W];
* ``tokens``: int64 token ids, N x L, right-padded with id 0; ``input_shape`` is [L], and the config
  also records ``vocab_size`` (every id is below it) and ``max_len`` (L);
* ``vectors``: float32 feature vectors, N x D, ``input_shape`` [D].

PFLlib's legacy files store one pickled dict under the key ``data``; :func:`read_client_arrays`
also reads them, through an unpickler that accepts NumPy arrays and nothing else. Before any
array is allocated, its header's shape and dtype are checked against the bytes the file really
holds, so a corrupt header cannot ask for terabytes.

``config.json`` records, per split, the :func:`content_hash` of every client's arrays
(``content_sha256``), so a loader can tell that the files are the ones the generator wrote.
"""
from __future__ import annotations

import hashlib
import io
import json
import pickle
import zipfile
from pathlib import Path
from typing import Any, Dict, Tuple

import numpy as np

from dataset.utils.atomic_io import atomic_path

CONFIG_NAME = "config.json"

# The kinds of x a dataset folder may hold (config.json's "input_kind").
IMAGE_INPUTS = "image"
TOKEN_INPUTS = "tokens"
VECTOR_INPUTS = "vectors"  # float32 feature vectors, N x D (e.g. Amazon Review's bag of words, -m AmazonMLP)
INPUT_KINDS = (IMAGE_INPUTS, TOKEN_INPUTS, VECTOR_INPUTS)


class DatasetFileError(ValueError):
    """A client file or config is missing, corrupt or of an unsupported kind."""


def client_file(root: Path, split: str, client_id: int) -> Path:
    return Path(root) / split / f"{client_id}.npz"


def write_client_arrays(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    """Write ``x``, ``y`` as plain arrays, atomically (temporary name, then rename)."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, x=np.ascontiguousarray(x), y=np.ascontiguousarray(y))


def read_client_arrays(path: Path) -> Tuple[np.ndarray, np.ndarray]:
    """Return ``(x, y)`` from a client file in the plain or in PFLlib's legacy pickled format."""
    path = Path(path)
    if not path.is_file():
        raise DatasetFileError(f"missing client file {path}")
    try:
        check_npz_headers(path)
        with np.load(path, allow_pickle=False) as npz:
            keys = set(npz.files)
            if {"x", "y"} <= keys:
                return npz["x"], npz["y"]
        if keys == {"data"}:
            return _read_legacy(path)
    except DatasetFileError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise DatasetFileError(f"cannot read {path}: {err}; the file is truncated or corrupt") from err
    raise DatasetFileError(f"{path} holds keys {sorted(keys)}, expected 'x' and 'y'")


def check_npz_headers(path: Path) -> None:
    """Refuse an ``.npz`` whose array headers claim more bytes than its members hold.

    ``np.load`` allocates the array a header describes before reading it; a damaged or hostile header
    (shape ``(10**12,)``) would exhaust memory instead of failing. Each ``.npy`` member's header is
    parsed here and its ``shape x itemsize`` compared with the member's size in the archive, and a
    stored (uncompressed) member's size with the size of the file on disk.
    """
    disk_size = Path(path).stat().st_size
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if not info.filename.endswith(".npy"):
                continue
            if info.compress_type == zipfile.ZIP_STORED and info.file_size > disk_size:
                raise DatasetFileError(f"{path}: member {info.filename} claims {info.file_size} bytes but the "
                                       f"file has {disk_size}; the file is truncated or corrupt")
            with archive.open(info) as member:
                version = np.lib.format.read_magic(member)
                read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                               (2, 0): np.lib.format.read_array_header_2_0}.get(version)
                if read_header is None:
                    raise DatasetFileError(f"{path}: member {info.filename} has .npy format version {version}, "
                                           f"expected 1.0 or 2.0; the file is corrupt")
                shape, _, dtype = read_header(member)
            if dtype.hasobject:
                continue  # a pickled member: its size is bounded by the bytes read, checked when unpickled
            needed = int(np.prod(shape, dtype=object)) * dtype.itemsize
            if needed > info.file_size:
                raise DatasetFileError(f"{path}: member {info.filename} claims an array of shape {shape} and "
                                       f"dtype {dtype} ({needed} bytes) but holds {info.file_size} bytes; the "
                                       f"file is truncated or corrupt")


def content_hash(x: np.ndarray, y: np.ndarray) -> str:
    """SHA-256 of two arrays' dtypes, shapes and values (not of the file: zip timestamps vary)."""
    digest = hashlib.sha256()
    for arr in (x, y):
        arr = np.ascontiguousarray(arr)
        digest.update(f"{arr.dtype.str}{arr.shape};".encode())
        digest.update(arr.tobytes())
    return digest.hexdigest()


class _ArraysOnlyUnpickler(pickle.Unpickler):
    """Resolves only the globals NumPy needs to rebuild arrays; anything else is refused."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"), ("numpy", "dtype"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: only NumPy arrays are allowed")


def _read_legacy(path: Path) -> Tuple[np.ndarray, np.ndarray]:
    with zipfile.ZipFile(path) as archive:
        raw = io.BytesIO(archive.read("data.npy"))
    major, _ = np.lib.format.read_magic(raw)
    read_header = (np.lib.format.read_array_header_1_0 if major == 1
                   else np.lib.format.read_array_header_2_0)
    shape, _, dtype = read_header(raw)
    if dtype != np.dtype(object) or shape != ():
        raise DatasetFileError(f"{path}: legacy key 'data' must hold one pickled dict")
    try:
        payload = _ArraysOnlyUnpickler(raw).load()
    except pickle.UnpicklingError as err:
        raise DatasetFileError(f"{path}: {err}") from err
    if isinstance(payload, np.ndarray) and payload.dtype == object and payload.shape == ():
        payload = payload.item()  # np.savez wraps the dict in a 0-d object array
    if not isinstance(payload, dict) or not {"x", "y"} <= set(payload):
        raise DatasetFileError(f"{path}: legacy payload is not a dict with 'x' and 'y'")
    x, y = payload["x"], payload["y"]
    for key, arr in (("x", x), ("y", y)):
        if not isinstance(arr, np.ndarray) or arr.dtype == object:
            raise DatasetFileError(f"{path}: legacy '{key}' is not a numeric NumPy array "
                                   f"(PFLlib's text files are not supported: rebuild them with "
                                   f"this project's generator, which writes token ids)")
    return x, y


def input_kind(config: Dict[str, Any]) -> Any:
    """The kind of inputs a config describes; one without ``input_kind`` holds images (PFLlib's and
    this project's image configs never record it). Not checked here: the caller names a bad value."""
    return config.get("input_kind", IMAGE_INPUTS)


def write_config(root: Path, config: Dict[str, Any]) -> None:
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    with atomic_path(root / CONFIG_NAME) as tmp:
        Path(tmp).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def read_config(root: Path) -> Dict[str, Any]:
    """The dataset's ``config.json`` as a dict; a missing, corrupt or non-object file raises
    :class:`DatasetFileError`, as does a ``num_clients`` that is not a positive whole number."""
    path = Path(root) / CONFIG_NAME
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DatasetFileError(f"missing {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DatasetFileError(f"corrupt {path}: {err}") from err
    except OSError as err:
        raise DatasetFileError(f"cannot read {path}: {err.strerror or err}") from err
    if not isinstance(config, dict):
        raise DatasetFileError(f"{path} holds a JSON {type(config).__name__}, expected an object "
                               f"with num_clients, num_classes, ...")
    clients = config.get("num_clients")
    if "num_clients" in config and (isinstance(clients, bool) or not isinstance(clients, int) or clients < 1):
        raise DatasetFileError(f"{path}: num_clients is {clients!r}, expected a positive whole number")
    return config


def read_xy_npz(source: Path) -> Tuple[np.ndarray, np.ndarray]:
    """The arrays ``x`` and ``y`` of a local ``--source`` file (no pickled objects)."""
    source = Path(source)
    if not source.is_file():
        raise FileNotFoundError(f"--source file {source} does not exist")
    with np.load(source, allow_pickle=False) as npz:
        if not {"x", "y"} <= set(npz.files):
            raise DatasetFileError(f"{source} must hold arrays 'x' and 'y', found {npz.files}")
        return npz["x"], npz["y"]
