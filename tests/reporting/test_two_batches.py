"""Two batches over one results folder: a run's log belongs to the batch that runs it, and a batch that
finds a run held by another live process says it runs elsewhere, leaving its log alone."""
import os
import sys
import threading
import time

import pytest

import grid.launcher as launcher
from grid.cli import settings_from_flags
from grid.launcher import ELSEWHERE, execute, run_environment
from grid.logs import claim_log
from grid.plan import plan_runs
from grid.summary import summarize
from utils.run_lock import RunLock


@pytest.fixture
def batch(tmp_path):
    """The settings and plan of a one-run batch into ``tmp_path/results``, its logs folder made."""
    settings = settings_from_flags(["-a", "FedAvg", "-d", "Digits", "-p", "-", "-s", "0", "-m", "DNN",
                                    "--results_dir", str(tmp_path / "results"), "--data_dir", str(tmp_path)])
    os.makedirs(settings.logs_dir)
    plan = plan_runs(settings)
    return settings, plan, f"{settings.logs_dir}/{plan.runs[0].log_name}"


def run_batch(settings, plan):
    execution = execute(settings, plan, ["missing"], {}, run_environment())
    return execution, summarize(settings, plan, execution)


def test_a_run_whose_log_another_batch_holds_is_left_to_it(batch, capsys):
    settings, plan, log = batch
    other = claim_log(log)  # what another batch holds from before it starts the run until the run ends
    other.write("# the other batch's run\nround 0/20\n")
    other.flush()
    execution, summary = run_batch(settings, plan)
    assert execution.outcomes == {0: ELSEWHERE}
    assert open(log).read() == "# the other batch's run\nround 0/20\n"  # untouched
    assert summary.exit_code == 0 and summary.lines() == [
        "run_all: 1 runs: 0 done, 0 skipped (complete), 1 running elsewhere, 0 failed",
        f"  running elsewhere: {plan.runs[0].name} (its log is held by another batch); run the batch again once "
        f"it has ended"]
    assert f"run_all: elsewhere {plan.runs[0].name} (its log is held by another batch): not started here" in \
        capsys.readouterr().out
    other.close()


def test_a_run_whose_results_another_live_process_writes_is_left_to_it(batch):
    settings, plan, log = batch
    with RunLock(plan.runs[0].result_file):  # e.g. main.py started by hand under the same name
        execution, summary = run_batch(settings, plan)
    assert execution.outcomes == {0: ELSEWHERE} and not os.path.exists(log)
    assert summary.lines()[1].startswith(f"  running elsewhere: {plan.runs[0].name} (being written by process "
                                         f"{os.getpid()})")


def test_two_batches_at_once_each_log_holds_one_run(batch, tmp_path, monkeypatch):
    """Batch A runs the run (a stand-in for main.py that waits for a signal file); batch B, started
    meanwhile, leaves it to A; A's log holds A's lines only, and A reports its own success."""
    settings, plan, log = batch
    go = tmp_path / "go"
    stand_in = tmp_path / "main.py"
    stand_in.write_text("import os, sys, time\nprint('run of batch A', flush=True)\n"
                        f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.01)\nprint('done', flush=True)\n")
    monkeypatch.setattr(launcher, "MAIN", str(stand_in))
    outcome = {}
    first = threading.Thread(target=lambda: outcome.update(a=run_batch(settings, plan)))
    first.start()
    deadline = time.time() + 30
    while "run of batch A" not in (open(log).read() if os.path.exists(log) else "") and time.time() < deadline:
        time.sleep(0.01)
    second, _ = run_batch(settings, plan)
    go.write_text("")
    first.join(30)
    assert second.outcomes == {0: ELSEWHERE}
    execution, summary = outcome["a"]
    assert execution.outcomes == {0: 0} and summary.exit_code == 0
    lines = open(log).read().splitlines()
    assert len(lines) == 3 and lines[0].startswith("# ") and lines[1:] == ["run of batch A", "done"]
    assert f"{sys.executable} {stand_in}" in lines[0]
    again = claim_log(log)  # the run has ended: the log is free again
    assert again is not None
    again.close()
