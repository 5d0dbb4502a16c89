"""report.py, the last step of every benchmark, against bad run files: each is listed as left out with its
reason while the rest is reported as without it; and every output is written atomically."""
import resource
import subprocess
import sys

import h5py
import numpy as np
import pytest

import report
from test_report import batch, write_run  # noqa: F401 (batch is a fixture)
from helpers import REPO


def replace_dataset(name, data):
    def change(f):
        if name in f:
            del f[name]
        f.create_dataset(name, data=data)
    return change


def replace_by_group(f):
    del f["rs_test_acc"]
    f.create_group("rs_test_acc").create_dataset("x", data=[0.5])


def set_attr(name, value):
    def change(f):
        f.attrs[name] = value
    return change


BAD_FILES = {
    "bytes": (replace_dataset("rs_test_acc", np.void(b"0.5 0.6")), "rs_test_acc holds raw bytes, not numbers"),
    "byte-strings": (replace_dataset("rs_test_acc", np.array([b"0.5", b"0.6"])),
                     "rs_test_acc holds bytes, not numbers"),
    "text": (replace_dataset("rs_test_acc", np.array(["0.5", "0.6"], dtype=h5py.string_dtype())),
             "rs_test_acc holds text, not numbers"),
    "one-string": (replace_dataset("rs_test_acc", "0.5"), "rs_test_acc holds bytes, not numbers"),
    "2-D": (replace_dataset("rs_test_acc", np.full((2, 2), 0.5)),
            "rs_test_acc has shape (2, 2), not one value per evaluation"),
    "group": (replace_by_group, "unreadable: rs_test_acc is a group of other objects, not an array"),
    "inf": (replace_dataset("rs_test_acc", [0.5, np.inf]), "rs_test_acc holds inf, not an accuracy in [0, 1]"),
    "5.0": (replace_dataset("rs_test_acc", [0.5, 5.0]), "rs_test_acc holds 5.0, not an accuracy in [0, 1]"),
    "nan": (replace_dataset("rs_test_acc", [np.nan, 0.5]), "rs_test_acc holds nan, not an accuracy in [0, 1]"),
    "negative": (replace_dataset("rs_test_acc", [-0.1, 0.5]), "rs_test_acc holds -0.1, not an accuracy in [0, 1]"),
    "true-false": (replace_dataset("rs_test_acc", [True, False]), "rs_test_acc holds true/false values, not numbers"),
    "complete-no": (set_attr("complete", "no"), "attribute complete is 'no', not true or false"),
    "run-text": (set_attr("run", "first"), "attribute run is 'first', not a run index"),
    "clients-7": (replace_dataset("rs_client_acc", np.full((2, 3), 7.0)),
                  "rs_client_acc holds 7.0, not an accuracy in [0, 1]"),
    "rounds-text": (replace_dataset("rs_eval_round", np.array(["a", "b"], dtype=h5py.string_dtype())),
                    "rs_eval_round holds text, not round numbers"),
    "eval-gap": (set_attr("config", '{"eval_gap": "x"}'), "its config's eval_gap is 'x', not a positive whole number"),
    "scores-1-D": (replace_dataset("lag_conflict_scores", np.ones(4)),
                   "lag_conflict_scores has shape (4,), not rounds x layers"),
    "layer-names": (replace_dataset("lag_layer_names", np.array(["a"], dtype=h5py.string_dtype())),
                    "lag_layer_names is not one name per layer of lag_conflict_scores (3)"),
    "not-hdf5": (None, "unreadable: "),
}


@pytest.mark.parametrize("bad", BAD_FILES)
def test_a_bad_file_is_left_out_with_its_reason_and_the_rest_is_reported(bad, batch, tmp_path, capsys):  # noqa: F811
    assert report.main([str(batch), "-o", str(tmp_path / "clean"), "--no-plots"]) == 0
    capsys.readouterr()
    change, reason = BAD_FILES[bad]
    path = write_run(batch, "MNIST-dir0.1", "FedLAG", 7, [0.4, 0.5], lag=True)
    if change is None:
        path.write_bytes(b"not an HDF5 file")
    else:
        with h5py.File(path, "a") as f:
            change(f)
    out = tmp_path / "with-bad-file"
    assert report.main([str(batch), "-o", str(out), "--no-plots"]) == 0
    printed = capsys.readouterr().out
    assert f"left out {path.name}: {reason}" in printed, printed
    for table in ("table.md", "table.csv", "summary.csv"):
        assert (out / table).read_text() == (tmp_path / "clean" / table).read_text()
    assert f"- `{path.name}`: {reason}" in (out / "report.md").read_text()


def test_a_file_size_limit_leaves_the_previous_report_whole(batch, tmp_path):  # noqa: F811
    """Under a file-size limit (RLIMIT_FSIZE: the kernel's EFBIG part-way through a write) the tables
    already there stay as they were, not cut mid-row, and the report says so in one line."""
    out = tmp_path / "report"
    assert report.main([str(batch), "-o", str(out), "--no-plots"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    write_run(batch, "MNIST-dir1.0", "FedAvg", 1, [0.3, 0.35])  # a new run: every table changes

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (300, resource.RLIM_INFINITY))
    done = subprocess.run([sys.executable, str(REPO / "system" / "report.py"), str(batch), "-o", str(out),
                           "--no-plots"], capture_output=True, text=True, timeout=120, preexec_fn=limit_file_size)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr == (f"error: cannot write the report in {out} (File too large); each of its files is "
                           f"complete, or as it was before\n")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no temporary file left either
