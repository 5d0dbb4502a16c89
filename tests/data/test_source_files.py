"""Hostile ``--source`` files: every generator that reads a local ``.npz`` reads it through one checked path,
and refuses each kind of bad file in one line (exit status 2), before allocating anything large and
before writing anything."""
import io
import runpy
import sys
import tracemalloc
import zipfile

import numpy as np
import pytest

from helpers import REPO

IMAGE_GENERATORS = ["MNIST", "FashionMNIST", "EMNIST", "Cifar10", "Cifar100", "Digits", "TinyImagenet", "Omniglot",
                    "Digit5"]
TEXT_GENERATORS = ["AGNews", "SogouNews"]
N = 400


def images(n=N):
    return np.zeros((n, 8, 8), np.uint8)


def token_ids(n=N):
    return np.ones((n, 5), np.int64)


def labels(n=N):
    return np.arange(n, dtype=np.int64) % 10


def header_claiming(shape, dtype=np.uint8, payload=b"\0" * 400) -> bytes:
    """A .npy member whose header claims ``shape`` but which holds only ``payload``."""
    member = io.BytesIO()
    np.lib.format.write_array_header_1_0(member, {"descr": np.dtype(dtype).str, "fortran_order": False,
                                                  "shape": tuple(shape)})
    return member.getvalue() + payload


def claiming_58_gib(path, x):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", header_claiming((N, 5_000, 31_000)))  # 400 x 5000 x 31000 bytes = 58 GiB
        member = io.BytesIO()
        np.lib.format.write_array(member, labels())
        archive.writestr("y.npy", member.getvalue())


def objects(path, x):
    boxed = np.empty(N, dtype=object)
    boxed[:] = list(x)
    np.savez(path, x=boxed, y=labels())


def arrays(x=None, y=None):
    """A maker of a source holding ``x`` (default: the generator's own kind of inputs) and ``y``."""
    return lambda path, inputs: np.savez(path, x=inputs if x is None else x, y=labels() if y is None else y)


STRING_LABELS = labels().astype(str)
IMAGE_FORM = "x must hold uint8 images, N x H x W (grey) or N x H x W x 3 (RGB)"
# (name, the file's maker (path, the generator's kind of x), what the line says, whether it applies to texts)
BAD_SOURCES = [
    ("400-inputs-200-labels", arrays(y=labels(200)),
     "y must hold one whole-number label per sample of x (400); got int64 (200,)", True),
    ("float-labels", arrays(y=labels().astype(float) + 0.5),
     "y must hold one whole-number label per sample of x (400); got float64 (400,)", True),
    ("string-labels", arrays(y=STRING_LABELS),
     f"y must hold one whole-number label per sample of x (400); got {STRING_LABELS.dtype} (400,)", True),
    ("label-minus-1", arrays(y=np.r_[labels(N - 1), -1]), "y holds label -1; labels are 0..C-1 for C classes", True),
    ("label-1e9", arrays(y=np.r_[labels(N - 1), 10 ** 9]),
     "y holds label 1000000000, which asks for more classes than the 400 samples; labels are 0..C-1 for C classes",
     True),
    ("empty", lambda path, x: np.savez(path, x=x[:0], y=labels(0)), "x holds no samples", True),
    ("objects", objects, "x and y must be plain arrays of numbers, not arrays of Python objects (pickled)", True),
    ("58-GiB-header", claiming_58_gib, "member x.npy claims an array of shape (400, 5000, 31000) and dtype uint8 "
                                       "(62000000000 bytes) but holds 400 bytes; the file is truncated or corrupt",
     True),
    ("not-a-zip", lambda path, x: path.write_bytes(b"x" * 100), "is not a readable .npz (File is not a zip file)",
     True),
    ("nan-pixels", arrays(x=np.full((N, 8, 8), np.nan, np.float32)), f"{IMAGE_FORM}; got float32 (400, 8, 8)", False),
    ("1-D-x", arrays(x=images().ravel()[:N]), f"{IMAGE_FORM}; got uint8 (400,)", False),
    ("2-D-x", arrays(x=images().reshape(N, 64)), f"{IMAGE_FORM}; got uint8 (400, 64)", False),
    ("token-ids-as-floats", arrays(x=token_ids().astype(np.float32)),
     "x must hold integer token ids of shape (N, L); got float32 (400, 5)", "only"),
]
CASES = [(generator, name, make, line) for name, make, line, text in BAD_SOURCES
         for generator in (IMAGE_GENERATORS if text != "only" else []) + (TEXT_GENERATORS if text else [])]


def run_generator(name, argv, capsys):
    """``python dataset/generate_<name>.py argv``, in this process; returns (exit status, output)."""
    script = REPO / "dataset" / f"generate_{name}.py"
    saved = sys.argv
    sys.argv = [str(script), *argv]
    try:
        runpy.run_path(str(script), run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = stop.code
    finally:
        sys.argv = saved
    return code, capsys.readouterr().out


@pytest.mark.parametrize("generator, name, make, line", CASES, ids=[f"{g}-{n}" for g, n, _, _ in CASES])
def test_every_generator_refuses_a_bad_source_in_one_line_before_allocating_it(generator, name, make, line,
                                                                             tmp_path, capsys):
    source = tmp_path / "source"
    source.mkdir()
    files = [source / f"{domain}.npz" for domain in ("mnist", "mnistm", "svhn", "syn", "usps")] \
        if generator == "Digit5" else [tmp_path / "source.npz"]
    for file in files:
        make(file, token_ids() if generator in TEXT_GENERATORS else images())
    root = tmp_path / "data"
    tracemalloc.start()
    try:
        code, out = run_generator(generator, ["--source", str(source if generator == "Digit5" else files[0]),
                                              "--root", str(root)], capsys)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    lines = out.strip().splitlines()
    assert code == 2 and len(lines) == 1, out
    assert lines[0].startswith(f"error: {files[0]}") and line in lines[0], lines[0]
    assert peak < 50e6  # neither the claimed 58 GiB nor a class table for a label of 10**9
    assert not root.exists() or not any(root.rglob("*.npz"))  # nothing written
