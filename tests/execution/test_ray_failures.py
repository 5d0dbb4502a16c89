"""Ray executor under real failures: a worker process killed or stopped, the raylet killed, an address
where no cluster listens. A lost worker's clients are trained again on a new actor (the run's arrays
stay those of an uninterrupted run); anything that cannot be recovered stops the run with one line that
says what to do, keeping the rounds done in an ``.h5`` marked incomplete.

Failures are real signals sent to Ray's own processes (found by pid); nothing of the executor is faked.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import REPO, server_of_class, train, results_file
from flcore.aggregation import named_tensors
from flcore.registry import resolve
from utils.errors import RunError
from utils.result_utils import read_results

# Every test here starts or stops a local Ray: one worker of a parallel test run takes them all, in turn.
pytestmark = pytest.mark.xdist_group("ray")

MAIN = REPO / "system" / "main.py"
TIMING = {"rs_round_time"}
FedAvg = resolve("FedAvg")[0]


def _state(pid: int):
    """The process's state letter from /proc (R, S, T, Z ...), or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return None


def _start_time(pid: int):
    """Clock ticks after boot when the process started (None once gone): tells a pid from a recycled one."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _wait_for_state(pid: int, states, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while _state(pid) not in states:
        assert time.monotonic() < deadline, f"process {pid} still {_state(pid)!r} after {timeout} s"
        time.sleep(0.05)


def _descendants(pid: int) -> list:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        children = [p for p, pp in parents.items() if pp == parent]
        out += children
        todo += children
    return out


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _flags(*extra: str) -> tuple:
    return ("-algo", "FedAvg", "-gr", "2", "--executor", "ray", "--workers", "2", *extra)


def test_a_killed_worker_is_replaced_and_the_run_equals_an_uninterrupted_one(ray_session, data_dir, tmp_path):
    """Worker 0 (clients 0, 2, 4) is killed with SIGKILL before round 1 trains: its clients are trained
    again on a new actor, and every array of the .h5 and the global model match a sequential run."""
    class KillsWorkerZero(FedAvg):
        pids_seen = []

        def train_clients(self, clients):
            pids = self.executor.pids()
            self.pids_seen.append(pids)
            if self.current_round == 1:
                os.kill(pids[0], signal.SIGKILL)
                _wait_for_state(pids[0], (None, "Z"))
            super().train_clients(clients)

    killed = server_of_class(KillsWorkerZero, data_dir, tmp_path / "ray", *_flags())
    train(killed)
    reference = server_of_class(FedAvg, data_dir, tmp_path / "sequential", *_flags("--executor", "sequential"))
    train(reference)

    seen = KillsWorkerZero.pids_seen
    assert len(seen) == 3 and seen[2][0] != seen[1][0] and seen[2][1] == seen[0][1]  # slot 0 replaced
    got, attrs = read_results(results_file(killed))
    want, _ = read_results(results_file(reference))
    assert attrs["complete"] and set(got) == set(want)
    for name in set(want) - TIMING:
        assert np.array_equal(got[name], want[name]), name
    mine, theirs = named_tensors(killed.global_model), named_tensors(reference.global_model)
    assert all(np.array_equal(mine[n].detach().numpy(), theirs[n].detach().numpy()) for n in theirs)


def test_a_stopped_worker_times_out_and_keeps_the_rounds_done(ray_session, data_dir, tmp_path):
    """A worker stopped with SIGSTOP never answers: the run stops after --ray_timeout with a RunError
    naming the flag, and round 0's results are in the .h5, marked incomplete."""
    stopped, stopped_at = [], []

    class StopsWorkerOne(FedAvg):
        def train_clients(self, clients):
            pids = self.executor.pids()  # in round 0: the workers are up before the clock matters
            if self.current_round == 1:
                # Round 0 ran under a generous limit (workers start slowly on a loaded machine); now 3 s.
                self.executor.timeout = 3.0
                pid = pids[1]
                stopped.append(pid)
                os.kill(pid, signal.SIGSTOP)
                _wait_for_state(pid, ("T",))
                stopped_at.append(time.monotonic())
            super().train_clients(clients)

    server = server_of_class(StopsWorkerOne, data_dir, tmp_path, *_flags("--ray_timeout", "120"))
    try:
        with pytest.raises(RunError, match=r"round 1: no Ray worker returned a client for 3 s \(--ray_timeout\)"
                                           r".*clients 1, 3, 5.*Results so far kept in"):
            train(server)
    finally:
        for pid in stopped:  # the executor already asked Ray to kill it; make sure it does not linger stopped
            if _state(pid) not in (None, "Z"):
                os.kill(pid, signal.SIGKILL)
    # Stopped after 3 s of silence, not the 120 s round 0 had (timed from the stop: round 0 on a loaded
    # machine may itself take minutes).
    assert stopped_at and time.monotonic() - stopped_at[0] < 60
    arrays, attrs = read_results(results_file(server))
    assert not attrs["complete"]
    assert attrs["rounds_done"] == 1 and arrays["rs_eval_round"].tolist() == [0, 1]


def test_a_killed_raylet_stops_the_run_with_one_line_and_keeps_results(data_dir, tmp_path):
    """``main.py --executor ray`` whose raylet (the node's Ray daemon) is killed mid-run: exit status 2,
    one line saying what happened and where the results so far are, and an .h5 marked incomplete.
    Ray's node health checks are made frequent so that the node is declared dead within seconds."""
    pytest.importorskip("ray")
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_health_check_period_ms="500",
               RAY_health_check_timeout_ms="500", RAY_health_check_failure_threshold="3",
               RAY_health_check_initial_delay_ms="0",
               RAY_TMPDIR=tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # its own session (short socket paths)
    command = [sys.executable, str(MAIN), "-data", "Toy", "-nc", "6", "-gr", "100000", "-dev", "cpu", "-m", "DNN",
               "--data_dir", str(data_dir), "--results_dir", str(tmp_path), "--executor", "ray", "--workers", "2",
               "--ray_timeout", "90"]  # round 0 on a loaded machine: workers start slowly
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    ray_processes = []
    try:
        for line in proc.stdout:  # wait until a round is done, so there are results to keep
            if line.startswith("round"):
                break
        else:
            raise AssertionError(f"main.py ended before its first round: {proc.communicate()[1][-3000:]}")
        ray_processes = [(pid, _start_time(pid)) for pid in _descendants(proc.pid)]
        raylets = [pid for pid, _ in ray_processes if _name(pid) == "raylet"]
        assert len(raylets) == 1, [(_name(p), p) for p, _ in ray_processes]
        killed_at = time.monotonic()
        os.kill(raylets[0], signal.SIGKILL)
        _, stderr = proc.communicate(timeout=120)
        took = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid, started in ray_processes:  # whatever Ray left behind of this run (same pid, same start)
            if started is not None and _start_time(pid) == started and _state(pid) != "Z":
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, stderr[-3000:]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert "Results so far kept in" in lines[0] and ("raylet" in lines[0] or "--ray_timeout" in lines[0]), lines[0]
    assert took < 120  # the raylet's death seen by health checks in seconds, or at worst --ray_timeout
    arrays, attrs = read_results(tmp_path / "Toy_FedAvg_test_0.h5")
    assert not attrs["complete"] and attrs["rounds_done"] >= 1 and len(arrays["rs_test_acc"]) >= 1


def test_an_unreachable_ray_address_is_refused_in_seconds(data_dir, tmp_path):
    """Nothing listens on 127.0.0.1:1: one line naming the flag and the fix, exit status 2, no waiting."""
    pytest.importorskip("ray")
    command = [sys.executable, str(MAIN), "-data", "Toy", "-nc", "6", "-gr", "1", "-dev", "cpu", "-m", "DNN",
               "--data_dir", str(data_dir), "--results_dir", str(tmp_path), "--executor", "ray",
               "--ray_address", "127.0.0.1:1"]
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert time.monotonic() - start < 30
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [
        "error: cannot reach a Ray cluster at --ray_address 127.0.0.1:1 (Connection refused); start one there "
        "(ray start --head --port 1), fix the address, or leave --ray_address empty to start a local Ray"]
    assert not list(tmp_path.glob("*.h5"))


def test_the_ray_executor_without_ray_installed_is_one_line_before_any_data(monkeypatch):
    from app.options import parse_args, setup_problems
    monkeypatch.setitem(sys.modules, "ray", None)  # as on a machine with only requirements.txt
    problems, _ = setup_problems(parse_args(["--executor", "ray"]))
    assert problems == ["--executor ray needs Ray, which is not installed: pip install -r "
                        "requirements-distributed.txt (or run with --executor sequential)"]
