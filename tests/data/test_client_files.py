"""On-disk format: plain arrays round-trip; PFLlib's pickled files load only when they hold arrays."""
import io
import os
import zipfile

import numpy as np
import pytest

from dataset.utils.client_files import DatasetFileError, read_client_arrays, write_client_arrays


def write_legacy(path, payload):
    """A file shaped like PFLlib's: one 0-d object array, pickled, under the key 'data'."""
    holder = np.empty((), dtype=object)
    holder[()] = payload
    buf = io.BytesIO()
    np.lib.format.write_array(buf, holder, allow_pickle=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("data.npy", buf.getvalue())


def test_plain_round_trip_loads_without_pickle(tmp_path):
    x = np.random.default_rng(0).normal(size=(5, 1, 4, 4)).astype(np.float32)
    y = np.arange(5, dtype=np.int64)
    path = tmp_path / "train" / "0.npz"
    write_client_arrays(path, x, y)
    with np.load(path, allow_pickle=False) as npz:
        assert sorted(npz.files) == ["x", "y"]
    x2, y2 = read_client_arrays(path)
    assert np.array_equal(x, x2) and np.array_equal(y, y2) and x2.dtype == np.float32


def test_legacy_pfllib_file_is_read(tmp_path):
    x = np.ones((3, 1, 2, 2), dtype=np.float32)
    y = np.array([0, 1, 2])
    write_legacy(tmp_path / "0.npz", {"x": x, "y": y})
    x2, y2 = read_client_arrays(tmp_path / "0.npz")
    assert np.array_equal(x, x2) and np.array_equal(y, y2)


class Payload:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_pickled_non_array_object_is_refused_and_never_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_legacy(tmp_path / "0.npz", {"x": Payload(), "y": np.zeros(1)})
    with pytest.raises(DatasetFileError, match="only NumPy arrays"):
        read_client_arrays(tmp_path / "0.npz")
    assert not (tmp_path / "pwned").exists()


def test_legacy_object_array_payload_is_refused(tmp_path):
    write_legacy(tmp_path / "0.npz", {"x": np.array([("tokens", 3)], dtype=object), "y": np.zeros(1)})
    with pytest.raises(DatasetFileError):
        read_client_arrays(tmp_path / "0.npz")


def test_truncated_file_is_reported(tmp_path):
    path = tmp_path / "0.npz"
    write_client_arrays(path, np.zeros((50, 1, 8, 8), np.float32), np.zeros(50, np.int64))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetFileError, match="truncated or corrupt"):
        read_client_arrays(path)


def test_failed_write_leaves_the_old_file(tmp_path):
    path = tmp_path / "0.npz"
    write_client_arrays(path, np.zeros((2, 1, 2, 2), np.float32), np.zeros(2, np.int64))
    before = path.read_bytes()

    class Unconvertible:
        def __array__(self, *args, **kwargs):
            raise RuntimeError("cannot convert")
    with pytest.raises(RuntimeError):
        write_client_arrays(path, np.zeros((2, 1, 2, 2), np.float32), Unconvertible())
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["0.npz"]  # no temporary left behind
