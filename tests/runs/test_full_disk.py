"""A full disk at any write of a run (checkpoint, .h5, CSV, TensorBoard, lock): one line, exit status 2,
the results so far saved where the line says, and the checkpoints taken before it kept."""
import errno
import os
import resource
import subprocess
import tempfile

import pytest

import app.checkpoints
import app.run
import main
from utils.result_utils import read_results, result_path
from utils.run_lock import RunLock
from utils.tensorboard_log import TensorBoardLog
from helpers import cli, full_disk_from, main_command
from test_run_safety import one_error_line

NO_SPACE = f"({os.strerror(errno.ENOSPC)})"


@pytest.fixture
def spare(tmp_path, monkeypatch):
    """The system's temporary folder, where results go when their own folder cannot take them."""
    folder = tmp_path / "tmp"
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder / "pfl-results" / f"Toy_FedAvg_test_0-{os.getpid()}.h5"


def full_disk_at(monkeypatch, *writes: str) -> None:
    """Make ``writes`` fail as a full disk does: the checkpoint and TensorBoard from round 1 (round 0's
    worked), the .h5 and CSV beside it and the lock every time."""
    for write in writes:
        if write == "checkpoint":
            monkeypatch.setattr(app.checkpoints, "save_checkpoint", full_disk_from(2, app.checkpoints.save_checkpoint))
        elif write == "tensorboard":
            monkeypatch.setattr(TensorBoardLog, "add_round", full_disk_from(2, TensorBoardLog.add_round))
        elif write == ".h5":
            monkeypatch.setattr(app.run, "write_results", full_disk_from(1))
        elif write == "csv":
            monkeypatch.setattr(app.run, "write_run_csv", full_disk_from(1))
        elif write == "lock":
            monkeypatch.setattr(RunLock, "acquire", full_disk_from(1))


def run(data_dir, results, capsys, *extra):
    code = main.main(cli(data_dir, results, "-gr", "3", "--checkpoint_every", "1", *extra))
    out, err = capsys.readouterr()
    assert code == 2, out + err
    return one_error_line(err)


def test_a_checkpoint_that_cannot_be_written_keeps_the_older_ones_and_the_run_resumes(data_dir, tmp_path, capsys,
                                                                                    monkeypatch):
    results = tmp_path / "results"
    with monkeypatch.context() as patch:
        full_disk_at(patch, "checkpoint")
        line = run(data_dir, results, capsys)
    h5 = result_path(results, "Toy", "FedAvg", "test", 0)
    folder = next((results / "checkpoints" / h5.stem).iterdir())
    assert line == (f"error: round 1: cannot write a checkpoint in {folder} {NO_SPACE}. Results so far kept in "
                    f"{h5}; the checkpoints before it are kept in {folder}: free space and rerun with --resume")
    arrays, attrs = read_results(h5)
    assert not attrs["complete"] and list(arrays["rs_eval_round"]) == [0, 1]
    assert sorted(p.name for p in folder.iterdir()) == ["round_000000.pt", "round_000000.sha256"]

    assert main.main(cli(data_dir, results, "-gr", "3", "--checkpoint_every", "1", "--resume")) == 0
    assert "resumed after round 0" in capsys.readouterr().out
    arrays, attrs = read_results(h5)
    assert attrs["complete"] and list(arrays["rs_eval_round"]) == [0, 1, 2, 3]
    assert not (results / "checkpoints").exists()


@pytest.mark.parametrize("writes, expected", [
    (("checkpoint", ".h5"), "error: round 1: cannot write a checkpoint in {folder} {why}. Results so far kept in "
                            "{spare} (not {h5}: {bare}); the checkpoints before it are kept in {folder}: free "
                            "space and rerun with --resume"),
    ((".h5",), "error: cannot write {h5} {why}; the complete results were written to {spare} instead: move that file "
               "there (the checkpoints are kept)"),
    (("csv",), "error: cannot write {csv} {why}; the complete results are in {h5}"),
    (("checkpoint", "csv"), "error: round 1: cannot write a checkpoint in {folder} {why}. Results so far kept in {h5} "
                            "(its CSV could not be written: {csv} {why}); the checkpoints before it are kept in "
                            "{folder}: free space and rerun with --resume"),
    (("tensorboard",), "error: round 1: cannot write TensorBoard's log in {board} {why}. Results so far kept in "
                       "{h5}; the checkpoints before it are kept in {folder}: free space and rerun with --resume"),
    (("lock",), "error: --results_dir: cannot write the run's lock {lock} {why}; free space there or choose a "
                "writable folder"),
], ids=["checkpoint-and-h5", "h5-at-the-end", "csv", "checkpoint-and-csv", "tensorboard", "lock"])
def test_every_write_that_fails_ends_in_one_line_with_the_results_where_it_says(writes, expected, data_dir, tmp_path,
                                                                              capsys, monkeypatch, spare):
    if "tensorboard" in writes:
        pytest.importorskip("torch.utils.tensorboard")
    results = tmp_path / "results"
    full_disk_at(monkeypatch, *writes)
    line = run(data_dir, results, capsys, *(["--tensorboard"] if "tensorboard" in writes else []))
    h5 = result_path(results, "Toy", "FedAvg", "test", 0)
    folders = list((results / "checkpoints" / h5.stem).glob("*"))
    assert line == expected.format(
        h5=h5, spare=spare, csv=h5.with_suffix(".csv"), lock=h5.with_suffix(".lock"), why=NO_SPACE,
        bare=NO_SPACE[1:-1], folder=folders[0] if folders else None, board=results / "tensorboard" / h5.stem)
    if "lock" in writes:
        assert not h5.exists() and not spare.exists()
        return
    saved = spare if ".h5" in writes else h5
    arrays, attrs = read_results(saved)
    finished = writes in ((".h5",), ("csv",))
    assert attrs["complete"] == finished
    assert list(arrays["rs_eval_round"]) == ([0, 1, 2, 3] if finished else [0, 1])
    assert saved.with_suffix(".csv").is_file() != ("csv" in writes)
    if not finished:  # round 0's checkpoint, to resume from
        assert sorted(p.name for p in folders[0].iterdir()) == ["round_000000.pt", "round_000000.sha256"]


def test_a_real_file_size_limit_at_the_first_checkpoint(data_dir, tmp_path):
    """The kernel's own error (RLIMIT_FSIZE: EFBIG, 'File too large') when round 0's checkpoint passes the
    limit that the smaller .h5 and CSV stay under: one line, and the round done is in the .h5."""
    results = tmp_path / "results"

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, resource.RLIM_INFINITY))
    done = subprocess.run(main_command(*cli(data_dir, results, "--checkpoint_every", "1")), capture_output=True,
                          text=True, timeout=120, preexec_fn=limit_file_size,
                          env=dict(os.environ, TMPDIR=str(tmp_path)))
    h5 = result_path(results, "Toy", "FedAvg", "test", 0)
    assert done.returncode == 2, done.stdout + done.stderr
    line = one_error_line(done.stderr)
    assert line.startswith("error: round 0: cannot write a checkpoint in ") and \
        line.endswith(f"({os.strerror(errno.EFBIG)}). Results so far kept in {h5}"), line
    arrays, attrs = read_results(h5)
    assert not attrs["complete"] and list(arrays["rs_eval_round"]) == [0]
    assert not (results / "checkpoints").exists()  # no checkpoint was written: no empty folders left
