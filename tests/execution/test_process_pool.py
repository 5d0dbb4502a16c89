"""Worker processes (``--executor processes``) and the default that chooses them (``--executor auto``):
the same bits as one process, errors surfaced as in one process, a lost worker named; the machine probe and
the choice against hand-made machines."""
import os
import signal

import numpy as np
import pytest
import torch
from torch import nn

import app.cores as cores
import app.run
from app.cores import Cores, MIN_SAMPLES_PER_CLIENT, auto_executor
from flcore.executors import process_pool
from flcore.executors.process_pool import ProcessExecutor, draws_global_randomness
from utils.errors import RunError
from utils.result_utils import read_results
from helpers import server_for, train, results_file

TIMING = {"rs_round_time"}


def arrays_of(data_dir, folder, *flags):
    server = server_for(data_dir, folder, *flags)
    train(server)
    return read_results(results_file(server))[0]


@pytest.mark.parametrize("algorithm, start", [("FedLAG", "fork"), ("Ditto", "fork"), ("FedLAG", "spawn")])
def test_two_worker_processes_give_one_process_bits(algorithm, start, data_dir, tmp_path, monkeypatch):
    """FedLAG (scores on updates that come back as copies) and Ditto (a personal model evaluated in the
    workers, the global one in the server); workers forked (Linux) and spawned (elsewhere, or a GPU). That
    every algorithm's shipped state carries what its training and evaluation read is checked in one
    process (tests/execution/test_executors.py)."""
    monkeypatch.setattr(process_pool, "start_method", lambda device: start)
    flags = ("-algo", algorithm, "-jr", "0.5", "-gr", "2", "--eval_after_training")
    expected = arrays_of(data_dir, tmp_path / "one", *flags, "--executor", "sequential")
    found = arrays_of(data_dir, tmp_path / "two", *flags, "--executor", "processes", "--workers", "2")
    assert set(found) == set(expected)
    for name in set(expected) - TIMING:
        a, b = found[name], expected[name]
        same = a.tolist() == b.tolist() if a.dtype == object else np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
        assert same, name


def test_a_worker_error_stops_the_run_as_in_one_process(data_dir, tmp_path, capsys):
    """Training that diverges in a worker stops the run with the error training in the server's process
    gives, results so far kept."""
    flags = ("-lr", "1e30", "-gr", "3")
    lines = {}
    for executor in ("sequential", "processes"):
        server = server_for(data_dir, tmp_path / executor, *flags, "--executor", executor, "--workers", "2")
        with pytest.raises(RunError) as stop:
            train(server)
        lines[executor] = str(stop.value).replace(executor, "")
        assert "client 0 reached a non-finite loss" in str(stop.value)  # the first client in order, as in turn
        assert len(read_results(results_file(server))[0]["rs_test_acc"]) >= 1
    assert lines["sequential"] == lines["processes"]


def test_a_lost_worker_is_named_with_its_client(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-jr", "1")
    executor = ProcessExecutor(server, 2)
    try:
        victim = executor.workers[0].process
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(timeout=10)
        with pytest.raises(RunError, match=r"worker process 0 \(pid \d+\) was killed with client \d+"):
            executor.train(server.clients)
    finally:
        executor.close()
    assert executor.workers == []


def test_workers_are_forked_on_linux_with_the_cpu_only(monkeypatch):
    monkeypatch.setattr(process_pool.sys, "platform", "linux")
    assert process_pool.start_method("cpu") == "fork" and process_pool.start_method("cuda:0") == "spawn"
    monkeypatch.setattr(process_pool.sys, "platform", "darwin")
    assert process_pool.start_method("cpu") == "spawn"


def test_dropout_models_draw_from_the_global_generator():
    assert draws_global_randomness(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)))
    assert draws_global_randomness(nn.LSTM(4, 4, num_layers=2, dropout=0.2))
    assert not draws_global_randomness(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.0), nn.LSTM(4, 4)))


# ----- the machine and the choice ---------------------------------------------------------------------

def test_free_cores_are_the_usable_ones_that_are_idle():
    assert Cores(2, 1.8).free == 2       # idle three quarters of a core and more: free
    assert Cores(2, 1.7).free == 1
    assert Cores(2, 0.1).free == 1       # never fewer than one: this run's own
    assert Cores(2, 7.5).free == 2       # idle cores of a host beyond this process's quota
    assert Cores(4, None).free == 4      # idleness unknown: every usable core
    assert Cores(2, 1.8).describe() == "2 of 2 cores free, 1.8 idle"


def test_idle_cores_from_two_readings_of_the_kernel(monkeypatch):
    readings = iter([(100, 1000, 2), (250, 1200, 2)])  # (idle, all jiffies, cpus)
    monkeypatch.setattr(cores, "_cpu_times", lambda: next(readings))
    assert cores.idle_cores(seconds=0) == pytest.approx(150 / 200 * 2)
    monkeypatch.setattr(cores, "_cpu_times", lambda: None)
    assert cores.idle_cores(seconds=0) is None


def test_a_container_quota_caps_the_usable_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(cores, "_cgroup_quota", lambda: 1.5)
    assert cores.usable_cores() == 1
    monkeypatch.setattr(cores, "_cgroup_quota", lambda: None)
    assert cores.usable_cores() == 4


def machine(free: float):
    asked = []

    def probe():
        asked.append(True)
        return Cores(2, free)
    return probe, asked


def test_auto_takes_worker_processes_where_cores_are_free_and_clients_large():
    probe, asked = machine(2.0)
    choice = auto_executor(probe, 20, 2600, "cpu", False)
    assert (choice.kind, choice.workers) == ("processes", 2) and asked
    assert auto_executor(probe, 20, 2600, "cpu", False, workers=3).workers == 3  # --workers wins
    assert auto_executor(probe, 2, 2600, "cpu", False, workers=3).workers == 2   # no more than clients


@pytest.mark.parametrize("clients, samples, device, dropout, workers, reason", [
    (20, 2600, "cuda:0", False, 0, "on cuda:0"),
    (20, 2600, "cpu", False, 1, "--workers 1"),
    (1, 2600, "cpu", False, 0, "one client trains per round"),
    (20, 2600, "cpu", True, 0, "dropout"),
    (20, MIN_SAMPLES_PER_CLIENT - 1, "cpu", False, 0, "too small to gain"),
])
def test_auto_stays_in_one_process_without_watching_the_machine(clients, samples, device, dropout, workers,
                                                                 reason):
    probe, asked = machine(2.0)
    choice = auto_executor(probe, clients, samples, device, dropout, workers)
    assert choice.kind == "sequential" and reason in choice.reason
    assert not asked  # the probe watches the machine for a moment: only when it decides


def test_auto_stays_in_one_process_on_a_busy_machine():
    probe, _ = machine(0.6)
    choice = auto_executor(probe, 20, 2600, "cpu", False)
    assert choice.kind == "sequential" and choice.reason == "1 of 2 cores free, 0.6 idle"


def test_the_run_says_what_auto_chose(data_dir, tmp_path, capsys, monkeypatch):
    server = server_for(data_dir, tmp_path, "-jr", "1")
    executor = app.run.make_executor(server, server.config)
    samples = sum(c.train_samples for c in server.clients) / len(server.clients)
    assert type(executor).__name__ == "SequentialExecutor"
    assert capsys.readouterr().out == (f"clients: one after another in this process (clients of {samples:.0f} "
                                       f"samples a round are too small to gain from other processes)\n")
    monkeypatch.setattr(cores, "MIN_SAMPLES_PER_CLIENT", 1)
    monkeypatch.setattr(app.run, "machine_cores", lambda: Cores(2, 2.0))
    executor = app.run.make_executor(server, server.config)
    try:
        assert isinstance(executor, ProcessExecutor) and len(executor.workers) == 2
        assert capsys.readouterr().out.startswith("clients: 2 worker processes, one thread each (2 of 2 cores free")
    finally:
        executor.close()
    assert torch.get_num_threads() == 1
