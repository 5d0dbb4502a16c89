"""Client files that ask for more memory than they hold: a zip entry lying about its size, a deflate bomb,
a legacy pickle asking for a terabyte inside the allowed reconstruct or for a huge memo. Each is refused in
one line before it is allocated, bounded by the file's real size and the dataset's declared shapes; a
MemoryError is one line too."""
import io
import pickle
import shutil
import struct
import tracemalloc
import zipfile

import numpy as np
import pytest

import main
from dataset.utils.client_files import DatasetFileError, read_client_arrays
from helpers import cli

CLAIMED_BYTES = 1 << 31  # 2 GiB: past what any of these files holds, and below zip's 4 GiB without ZIP64


def npy(array) -> bytes:
    member = io.BytesIO()
    np.lib.format.write_array(member, np.asarray(array), allow_pickle=True)
    return member.getvalue()


def npy_header(shape, dtype) -> bytes:
    member = io.BytesIO()
    np.lib.format.write_array_header_1_0(member, {"descr": np.dtype(dtype).str, "fortran_order": False,
                                                  "shape": tuple(shape)})
    return member.getvalue()


def declare_size(path, name: str, size: int) -> None:
    """Make the zip entry ``name`` declare ``size`` uncompressed bytes, in its local and central headers."""
    data = bytearray(path.read_bytes())
    for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        start = 0
        while (start := data.find(signature, start)) >= 0:
            name_offset = start + (30 if signature == b"PK\x03\x04" else 46)
            if data[name_offset:name_offset + len(name)] == name.encode():
                data[start + offset:start + offset + 4] = struct.pack("<I", size)
            start += 4
    path.write_bytes(bytes(data))


def lying_entry(path, compression):
    """x.npy's header claims 2 GiB, its zip entry declares 2 GiB too, and it holds 400 bytes."""
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        archive.writestr("x.npy", npy_header((CLAIMED_BYTES // 4,), np.float32) + b"\0" * 400)
        archive.writestr("y.npy", npy(np.zeros(2, np.int64)))
    declare_size(path, "x.npy", CLAIMED_BYTES)


def deflate_bomb(path, samples: int):
    """A true x of ``samples`` zero images (1 x 8 x 8 float32), deflated to about a thousandth of its size."""
    header = npy_header((samples, 1, 8, 8), np.float32)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open("x.npy", "w", force_zip64=True) as member:
            member.write(header)
            zeros = bytes(1 << 20)
            for _ in range(samples * 256 // len(zeros)):
                member.write(zeros)
        archive.writestr("y.npy", npy(np.zeros(samples, np.int64)))


class HugeEmptyArray:
    """Pickles as NumPy's own reconstruct asked for a 1 TiB array: allowed globals, hostile arguments."""

    def __reduce__(self):
        return np.ndarray.__reduce__(np.zeros(0, np.int8))[0], (np.ndarray, (1 << 40,), b"b")


def legacy(path, pickled: bytes):
    """PFLlib's legacy layout: one 0-d object array ``data`` holding the pickle."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("data.npy", npy_header((), object) + pickled)


def huge_reconstruct(path):
    legacy(path, pickle.dumps({"x": HugeEmptyArray(), "y": np.zeros(2, np.int64)}, protocol=3))


def huge_memo(path):
    # EMPTY_DICT, then LONG_BINPUT 2**31: a C unpickler grows its memo table to 2**32 entries (32 GiB).
    legacy(path, b"\x80\x03}r" + struct.pack("<I", 1 << 31) + b".")


HOSTILE = {
    "lying-stored-entry": (lambda p: lying_entry(p, zipfile.ZIP_STORED), None,
                           f"claims an array of shape ({CLAIMED_BYTES // 4},) and dtype float32 ({CLAIMED_BYTES} "
                           f"bytes) but holds 400 bytes"),
    "lying-deflated-entry": (lambda p: lying_entry(p, zipfile.ZIP_DEFLATED), None,
                             f"claims an array of shape ({CLAIMED_BYTES // 4},) and dtype float32 ({CLAIMED_BYTES} "
                             f"bytes) but holds 400 bytes"),
    "deflate-bomb": (lambda p: deflate_bomb(p, 100_000), {"x": 6 * 64 * 8, "y": 6 * 8},
                     "x claims an array of shape (100000, 1, 8, 8) and dtype float32 (25600000 bytes), more than "
                     "config.json allows it (3072 bytes)"),
    "reconstruct-1-TiB": (huge_reconstruct, None, f"an array of {1 << 40} bytes asked for in a pickle of"),
    "memo-2**31": (huge_memo, None, f"legacy key 'data' stores memo entry {1 << 31} after 2 opcodes"),
}


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_file_asking_for_more_than_it_holds_is_refused_before_allocating(hostile, tmp_path):
    make, limits, message = HOSTILE[hostile]
    path = tmp_path / "0.npz"
    make(path)
    tracemalloc.start()
    try:
        with pytest.raises(DatasetFileError, match=message.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
            read_client_arrays(path, limits)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20e6, peak


def test_a_deflate_bomb_in_a_dataset_is_refused_by_its_config_in_one_line(data_dir, tmp_path, capsys):
    """config.json declares what each client file holds: a member inflating far past that is refused from
    its header, before it is inflated."""
    shutil.copytree(data_dir / "Toy", tmp_path / "data" / "Toy")
    target = tmp_path / "data" / "Toy" / "train" / "2.npz"
    deflate_bomb(target, 40_000)
    assert target.stat().st_size < 100_000  # 10 MB of images in a few kilobytes
    assert main.main(cli(tmp_path / "data", tmp_path)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train/2.npz: x claims an array of shape (40000, 1, 8, 8)" in err, err
    assert "more than config.json allows it" in err and "regenerate it with" in err


def test_a_memory_error_while_loading_is_one_line(data_dir, tmp_path, capsys, monkeypatch):
    def no_memory(*args, **kwargs):
        raise MemoryError()
    monkeypatch.setattr(np, "load", no_memory)
    with pytest.raises(DatasetFileError, match="not enough memory to load it"):
        read_client_arrays(data_dir / "Toy" / "train" / "0.npz")
    assert main.main(cli(data_dir, tmp_path)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "not enough memory to load it" in err, err


def test_compressed_files_within_their_bounds_still_load(tmp_path):
    """PFLlib writes its client files compressed: measured, not refused."""
    x, y = np.random.default_rng(0).normal(size=(5, 1, 8, 8)).astype(np.float32), np.arange(5)
    np.savez_compressed(tmp_path / "0.npz", x=x, y=y)
    got_x, got_y = read_client_arrays(tmp_path / "0.npz", {"x": 5 * 64 * 8, "y": 5 * 8})
    assert np.array_equal(got_x, x) and np.array_equal(got_y, y)
