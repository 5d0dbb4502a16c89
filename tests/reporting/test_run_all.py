"""run_all.sh: builds the datasets it needs, runs, skips finished runs, reports a failing one."""
import os
import subprocess
import sys

import h5py

from helpers import REPO

SCRIPT = str(REPO / "run_all.sh")


def run_all(cwd, *args):
    env = dict(os.environ, PYTHON=sys.executable)   # the interpreter running the tests, not PATH's
    return subprocess.run(["bash", SCRIPT, *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=env)


def test_runs_builds_data_reports_a_failure_then_skips_what_is_complete(tmp_path):
    data, results = tmp_path / "data", tmp_path / "results"
    grid = ["-d", "Digits", "-p", "dir1.0", "-s", "0", "-a", "FedAvg", "-r", "1", "-c", "6", "--goal", "t",
            "--data_dir", "data", "--results_dir", "results"]   # relative to the working directory
    # LeNet needs 12x12 images: only the data says so, so its run starts and fails; the other one runs on.
    first = run_all(tmp_path, *grid, "-m", "DNN,LeNet", "-j", "2", "--", "-dev", "cpu", "-lr", "0.05")
    out = first.stdout
    assert first.returncode == 1, out + first.stderr
    assert "2 runs: 1 done, 0 skipped (complete), 1 failed" in out
    assert ("FAILED Digits-dir1.0-nc6_FedAvg_t-LeNet_0 (exit 2): error: model LeNet needs inputs of at least "
            "1x12x12, got 1x8x8") in out
    log = results / "logs" / "Digits-dir1.0-nc6_FedAvg_t-LeNet_0.log"
    assert f"log: {log}" in out and "needs inputs of at least" in log.read_text()
    assert "round 1/1" in (results / "logs" / "Digits-dir1.0-nc6_FedAvg_t-DNN_0.log").read_text()
    config = (data / "Digits-dir1.0-nc6" / "config.json").read_text()   # built by the generator
    assert '"alpha": 1.0' in config and '"num_clients": 6' in config
    done = results / "Digits-dir1.0-nc6_FedAvg_t-DNN_0.h5"
    with h5py.File(done, "r") as f:
        assert bool(f.attrs["complete"]) and '"num_clients": 6' in f.attrs["config"]
    stamp = done.stat().st_mtime_ns

    second = run_all(tmp_path, *grid, "-m", "DNN", "--", "-dev", "cpu", "-lr", "0.05")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "1 runs: 0 done, 1 skipped (complete), 0 failed" in second.stdout
    assert done.stat().st_mtime_ns == stamp

    # Other flags than the finished run's: not skipped (shown without running anything).
    plan = run_all(tmp_path, *grid, "-m", "DNN", "--dry-run", "--", "-dev", "cpu", "-lr", "0.1")
    assert plan.returncode == 0 and "run (existing file made with other flags)" in plan.stdout
    # Run, the batch replaces it (main.py alone keeps a complete run of other flags), and its log says so.
    third = run_all(tmp_path, *grid, "-m", "DNN", "--", "-dev", "cpu", "-lr", "0.1")
    assert third.returncode == 0, third.stdout + third.stderr
    assert "(existing file stale: rerun)" in third.stdout
    with h5py.File(done, "r") as f:
        assert '"local_learning_rate": 0.1' in f.attrs["config"]
    log = (results / "logs" / "Digits-dir1.0-nc6_FedAvg_t-DNN_0.log").read_text()
    assert "note: replacing" in log and "(-lr 0.05 there, 0.1 here)" in log


def test_grid_file_sets_the_runs_and_flags_override_it(tmp_path):
    grid = tmp_path / "tiny.grid"
    grid.write_text("# a comment\nalgorithms: FedAvg FedRep+LAG   # trailing comment\ndatasets: MNIST\n"
                    "partitions: dir0.1 iid\nseeds: 0-1\nmodels: CNN\nrounds: 3\nclients: 5\n"
                    "source: MNIST=../shared/data/mnist-70k.npz\nargs: -lbs 16\nargs.FedRep: -pls 2\n")
    plan = run_all(tmp_path, "-g", str(grid), "-s", "4", "--dry-run", "--results_dir", str(tmp_path / "r"))
    assert plan.returncode == 0, plan.stderr
    runs = [line for line in plan.stdout.splitlines() if line.startswith("    python")]
    assert len(runs) == 4   # 2 algorithms x 2 partitions x 1 seed (flag over grid)
    assert "MNIST-iid-nc5_FedRep+LAG_tiny-CNN_4" in plan.stdout   # 5 clients: the folder says so
    rep = next(r for r in runs if "FedRep+LAG" in r and "MNIST-dir0.1-nc5" in r)
    assert "-gr 3 -nc 5" in rep and "-go tiny-CNN --seed 0 -pv 4 -t 5" in rep and rep.endswith("-lbs 16 -pls 2")
    assert "-pls" not in next(r for r in runs if "-algo FedAvg" in r)

    grid.write_text("algoritms: FedAvg\n")
    bad = run_all(tmp_path, "-g", str(grid), "--dry-run")
    assert bad.returncode == 2 and "unknown key 'algoritms'" in bad.stderr


def test_a_run_past_the_timeout_keeps_its_rounds_marked_incomplete(tmp_path):
    """--timeout sends SIGTERM, as coreutils' timeout does: the run saves the rounds it did, then ends (30 s:
    time for a heavily loaded machine to import torch and finish round 0 first)."""
    grid = ["-d", "Digits", "-p", "dir1.0", "-s", "0", "-a", "FedAvg", "-m", "DNN", "-r", "100000", "-c", "6",
            "--goal", "t", "--timeout", "30", "--data_dir", "data", "--results_dir", "results"]
    done = run_all(tmp_path, *grid, "--", "-dev", "cpu", "--threads", "1")
    assert done.returncode == 1 and "exit timed out after 30 s" in done.stdout, done.stdout + done.stderr
    h5 = tmp_path / "results" / "Digits-dir1.0-nc6_FedAvg_t-DNN_0.h5"
    with h5py.File(h5, "r") as f:
        assert not f.attrs["complete"] and len(f["rs_test_acc"]) >= 1
        assert list(f["rs_eval_round"]) == list(range(len(f["rs_test_acc"])))
    assert "stopped by SIGTERM. Results so far kept in" in done.stdout
    assert not h5.with_suffix(".lock").exists()
