"""Checkpoint and resume: a run killed with SIGKILL and resumed gives the uninterrupted run's arrays."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from utils.checkpoint import CheckpointError, load_latest_checkpoint, save_checkpoint
from utils.result_utils import read_results, result_path
from helpers import run_of, TEST_THREADS, REPO, cli, main_command, server_for, train, results_file

TIMING = {"rs_round_time"}
ROUNDS = 12


def command(data_dir, results_dir, algorithm, *extra):
    """main.py with the tests' explicit thread count: the in-process reference uses the same one."""
    return main_command(*cli(data_dir, results_dir, "-algo", algorithm, "-m", "DNN", "-jr", "0.5",
                             "-gr", str(ROUNDS), "--checkpoint_every", "1", *extra))


def kill_after_checkpoints(cmd, folder, count=3, timeout=60):
    """Start ``cmd`` and SIGKILL it once ``count`` checkpoints exist under ``folder`` (the results name's
    folder: checkpoints sit in a sub-folder per configuration); returns the killed process."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if folder.is_dir() and len(list(folder.rglob("round_*.sha256"))) >= 1 and \
                max(int(p.stem.split("_")[1]) for p in folder.rglob("round_*.sha256")) >= count - 1:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be killed: " + proc.stderr.read().decode()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return proc


@pytest.mark.crossprocess
@pytest.mark.parametrize("algorithm", ["FedAvg", "FedLAG", "Ditto"])
def test_killed_and_resumed_run_equals_an_uninterrupted_one(algorithm, data_dir, tmp_path):
    reference = server_for(data_dir, tmp_path / "clean", "-algo", algorithm, "-m", "DNN", "-jr", "0.5",
                           "-gr", str(ROUNDS))
    train(reference)
    expected, _ = read_results(results_file(reference))

    results = tmp_path / "killed"
    folder = results / "checkpoints" / f"Toy_{algorithm}_test_0"
    killed = kill_after_checkpoints(command(data_dir, results, algorithm), folder)
    assert killed.returncode == -signal.SIGKILL
    resumed = subprocess.run(command(data_dir, results, algorithm, "--resume"), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed after round" in resumed.stdout
    got, attrs = read_results(result_path(results, "Toy", algorithm, "test", 0))
    assert attrs["complete"]
    assert set(got) == set(expected)
    for name in set(got) - TIMING:
        assert np.array_equal(got[name], expected[name]), name
    assert not folder.exists()  # checkpoints are removed once the run completes


@pytest.mark.crossprocess
def test_a_killed_group_sharing_run_resumes_to_the_uninterrupted_runs_arrays(data_dir, tmp_path):
    """--lag_share groups: the group models formed at a round's aggregation reach the members with the next
    broadcast, so a checkpoint holds them until then. Killed after checkpoints of rounds with groups, and
    resumed, the run ends with the arrays of the run never interrupted."""
    groups = ("--lag_share", "groups")
    reference = server_for(data_dir, tmp_path / "clean", "-algo", "FedLAG", "-m", "DNN", "-jr", "0.5",
                           "-gr", str(ROUNDS), *groups)
    train(reference)
    expected, _ = read_results(results_file(reference))
    shared = [r for r, row in enumerate(expected["lag_groups"])
              if any(np.bincount(layer[layer >= 0]).max(initial=0) > 1 for layer in row)]
    assert shared and shared[0] < ROUNDS - 3, "no group formed early enough to be checkpointed"

    results = tmp_path / "killed"
    folder = results / "checkpoints" / "Toy_FedLAG_test_0"
    killed = kill_after_checkpoints(command(data_dir, results, "FedLAG", *groups), folder, count=shared[0] + 2)
    assert killed.returncode == -signal.SIGKILL
    resumed = subprocess.run(command(data_dir, results, "FedLAG", *groups, "--resume"), capture_output=True,
                             text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed after round" in resumed.stdout
    got, attrs = read_results(result_path(results, "Toy", "FedLAG", "test", 0))
    assert attrs["complete"] and set(got) == set(expected)
    for name in set(got) - TIMING:
        assert np.array_equal(got[name], expected[name]), name


def test_a_corrupt_newest_checkpoint_is_reported_and_the_previous_one_used(tmp_path):
    for rnd in range(3):
        save_checkpoint(tmp_path, rnd, {"round": torch.tensor(rnd)})
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == ["round_000001.pt", "round_000002.pt"]  # keeps 2
    newest = tmp_path / "round_000002.pt"
    newest.write_bytes(newest.read_bytes()[:-10])  # truncated
    found = load_latest_checkpoint(tmp_path)
    assert found.round == 1 and int(found.payload["round"]) == 1
    assert "round_000002.pt: checksum mismatch" in found.skipped[0]


def test_a_checkpoint_without_checksum_counts_as_interrupted(tmp_path):
    save_checkpoint(tmp_path, 0, {"x": 1})
    save_checkpoint(tmp_path, 1, {"x": 2})
    (tmp_path / "round_000001.sha256").unlink()
    found = load_latest_checkpoint(tmp_path)
    assert found.round == 0 and "no checksum" in found.skipped[0]


def test_no_usable_checkpoint_at_all_is_an_error(tmp_path):
    save_checkpoint(tmp_path, 0, {"x": 1})
    (tmp_path / "round_000000.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        load_latest_checkpoint(tmp_path)


def test_resume_with_other_flags_is_refused(data_dir, tmp_path):
    run_of(server_for(data_dir, tmp_path, "-gr", "3", "--checkpoint_every", "1")).save_checkpoint(1)
    other = server_for(data_dir, tmp_path, "-gr", "3", "--checkpoint_every", "1", "-lr", "0.01")
    with pytest.raises(CheckpointError, match=r"--local_learning_rate: 0.05 in the checkpoint, 0.01 now"):
        run_of(other).resume()


def test_a_checkpoint_from_before_a_flag_existed_resumes_while_the_flag_is_at_its_default(data_dir, tmp_path):
    from app.options import flag_defaults
    from utils.checkpoint import checkpoint_folder, config_differences
    server = server_for(data_dir, tmp_path, "-gr", "3", "--checkpoint_every", "1")
    current, defaults, results = server.config.flags(), flag_defaults(), results_file(server)
    older = {k: v for k, v in current.items() if k != "max_len"}   # written before -ml existed
    assert config_differences(older, current, defaults) == []
    assert checkpoint_folder(results, older, defaults) == checkpoint_folder(results, current, defaults)
    changed = dict(current, max_len=current["max_len"] + 1)
    assert config_differences(older, changed, defaults) == [f"--max_len: {current['max_len']!r} in the "
                                                            f"checkpoint, {current['max_len'] + 1!r} now"]
    assert checkpoint_folder(results, older, defaults) != checkpoint_folder(results, changed, defaults)


@pytest.mark.crossprocess
def test_resume_uses_the_checkpoints_thread_count(data_dir, tmp_path):
    """Killed under --threads 1, resumed with no --threads where the environment asks for 2 threads: the
    resumed run takes the checkpoint's count, says so, and still equals the uninterrupted run."""
    reference = server_for(data_dir, tmp_path / "clean", "-algo", "FedLAG", "-m", "DNN", "-jr", "0.5",
                           "-gr", str(ROUNDS))
    train(reference)
    expected, _ = read_results(results_file(reference))
    results = tmp_path / "killed"
    kill_after_checkpoints(command(data_dir, results, "FedLAG"), results / "checkpoints" / "Toy_FedLAG_test_0")
    flags = cli(data_dir, results, "-algo", "FedLAG", "-m", "DNN", "-jr", "0.5", "-gr", str(ROUNDS),
                "--checkpoint_every", "1", "--resume")
    env = dict(os.environ, OMP_NUM_THREADS=str(TEST_THREADS + 1))
    resumed = subprocess.run([sys.executable, str(REPO / "system" / "main.py"), *flags], capture_output=True,
                             text=True, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert f"using the checkpoint's {TEST_THREADS} intra-op threads" in resumed.stdout
    got, attrs = read_results(result_path(results, "Toy", "FedLAG", "test", 0))
    assert attrs["config"]["intra_op_threads"] == TEST_THREADS
    assert attrs["config"]["torch_version"] == torch.__version__
    for name in set(got) - TIMING:
        assert np.array_equal(got[name], expected[name]), name
