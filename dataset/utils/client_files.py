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
holds and what the dataset's config declares (:mod:`dataset.utils.npz_limits`), so neither a corrupt
header nor a compressed member that inflates to gigabytes can ask for more.

``config.json`` records, per split, the :func:`content_hash` of every client's arrays
(``content_sha256``), so a loader can tell that the files are the ones the generator wrote.
"""
from __future__ import annotations

import hashlib
import io
import json
import pickle
import pickletools
import zipfile
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from dataset.utils.atomic_io import atomic_path
from dataset.utils.npz_limits import NpzLimitError, check_npz

CONFIG_NAME = "config.json"
# The widest value a client file may store (float64, int64), for the bounds config.json implies.
MAX_ITEMSIZE = 8
# Bytes of pickle around a legacy file's arrays (opcodes, dtype and shape records).
LEGACY_OVERHEAD = 1 << 16

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


def read_client_arrays(path: Path, limits: Optional[Mapping[str, int]] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Return ``(x, y)`` from a client file in the plain or in PFLlib's legacy pickled format.

    Nothing is allocated before every array's header is found to claim no more than its member holds and,
    with ``limits`` (:func:`declared_limits`), no more than the dataset's config declares for this file;
    a file too large for the memory left is one :class:`DatasetFileError` too."""
    path = Path(path)
    if not path.is_file():
        raise DatasetFileError(f"missing client file {path}")
    try:
        keys = set(check_npz(path, limits))
        if {"x", "y"} <= keys:
            with np.load(path, allow_pickle=False) as npz:
                return npz["x"], npz["y"]
        if keys == {"data"}:
            return _read_legacy(path, None if limits is None else sum(limits.values()) + LEGACY_OVERHEAD)
    except DatasetFileError:
        raise
    except NpzLimitError as err:
        raise DatasetFileError(str(err)) from None
    except MemoryError:
        raise DatasetFileError(f"{path}: not enough memory to load it ({path.stat().st_size} bytes on disk)") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise DatasetFileError(f"cannot read {path}: {err}; the file is truncated or corrupt") from err
    raise DatasetFileError(f"{path} holds keys {sorted(keys)}, expected 'x' and 'y'")


def declared_limits(samples: int, input_shape: Sequence[int]) -> Dict[str, int]:
    """The most bytes ``x`` and ``y`` of a client file may take when ``config.json`` declares ``samples``
    samples of ``input_shape``: values of at most 8 bytes (float64 or int64), one label per sample."""
    return {"x": samples * int(np.prod(input_shape, dtype=object)) * MAX_ITEMSIZE, "y": samples * MAX_ITEMSIZE}


def content_hash(x: np.ndarray, y: np.ndarray) -> str:
    """SHA-256 of two arrays' dtypes, shapes and values (not of the file: zip timestamps vary)."""
    digest = hashlib.sha256()
    for arr in (x, y):
        arr = np.ascontiguousarray(arr)
        digest.update(f"{arr.dtype.str}{arr.shape};".encode())
        # The array's own bytes, seen as uint8 (any dtype): a whole dataset is hashed too, which tobytes() copies.
        digest.update(arr.reshape(-1).view(np.uint8))
    return digest.hexdigest()


class _ArraysOnlyUnpickler(pickle.Unpickler):
    """Resolves only the globals NumPy needs to rebuild arrays; anything else is refused. NumPy's pickles
    create each array empty and then fill it from bytes the pickle holds, so an empty array asking for
    more than ``limit`` bytes is refused before it is allocated."""

    _RECONSTRUCT = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct")}
    _ALLOWED = _RECONSTRUCT | {("numpy", "ndarray"), ("numpy", "dtype")}

    def __init__(self, file, limit: int):
        super().__init__(file)
        self.limit = limit

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}: only NumPy arrays are allowed")
        found = super().find_class(module, name)
        return self._bounded(found) if (module, name) in self._RECONSTRUCT else found

    def _bounded(self, reconstruct):
        def bounded(subtype, shape, dtype):
            size = int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize
            if size > self.limit:
                raise pickle.UnpicklingError(f"an array of {size} bytes asked for in a pickle of {self.limit}")
            return reconstruct(subtype, shape, dtype)
        return bounded


def _read_legacy(path: Path, limit: Optional[int]) -> Tuple[np.ndarray, np.ndarray]:
    """PFLlib's pickled dict of ``x`` and ``y``; at most ``limit`` bytes of pickle when given (the member's
    real size is bounded by :func:`check_npz` either way)."""
    with zipfile.ZipFile(path) as archive, archive.open("data.npy") as member:
        data = member.read() if limit is None else member.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise DatasetFileError(f"{path}: legacy key 'data' holds more than the {limit} bytes config.json allows "
                               f"this client; the file is corrupt or not this dataset's")
    raw = io.BytesIO(data)
    major, _ = np.lib.format.read_magic(raw)
    read_header = (np.lib.format.read_array_header_1_0 if major == 1
                   else np.lib.format.read_array_header_2_0)
    shape, _, dtype = read_header(raw)
    if dtype != np.dtype(object) or shape != ():
        raise DatasetFileError(f"{path}: legacy key 'data' must hold one pickled dict")
    problem = _memo_problem(data[raw.tell():])
    if problem:
        raise DatasetFileError(f"{path}: legacy key 'data' {problem}; the file is corrupt")
    try:
        payload = _ArraysOnlyUnpickler(raw, len(data)).load()
    except pickle.UnpicklingError as err:
        raise DatasetFileError(f"{path}: {err}") from err
    except MemoryError:
        raise
    except Exception as err:  # noqa: BLE001 - a corrupt pickle fails in many ways; none may end in a traceback
        raise DatasetFileError(f"{path}: legacy key 'data' is not a readable pickle ({type(err).__name__}: "
                               f"{err}); the file is corrupt") from None
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


def _memo_problem(pickled: bytes) -> Optional[str]:
    """Why the pickle's memo could grow out of bounds, or None. Pickles number their memo entries from 0
    up; an index far past the opcodes read so far would make the unpickler allocate a memo of gigabytes."""
    try:
        for count, (opcode, arg, _) in enumerate(pickletools.genops(pickled)):
            if opcode.name in ("PUT", "BINPUT", "LONG_BINPUT") and int(arg) > count:
                return f"stores memo entry {arg} after {count} opcodes"
    except Exception as err:  # noqa: BLE001 - only parsed, never run: any failure means a corrupt pickle
        return f"is not a readable pickle ({err})"
    return None


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
