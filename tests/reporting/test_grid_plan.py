"""The grid package in-process: how flags, a grid file and defaults become runs (run_all.sh's rules,
also used by benchmarks/paper_comparison.py), and how a batch's end is summarised."""
import pytest

from grid.cli import main, settings_from_flags
from grid.command_line import parse_command_line
from grid.launcher import SKIPPED, STOPPED, TIMED_OUT, UNBUILT, Execution
from grid.plan import plan_runs
from grid.summary import summarize
from grid.usage import UsageError


def test_flags_override_the_grid_and_every_run_gets_its_flags(tmp_path):
    grid = tmp_path / "small.grid"
    grid.write_text("algorithms: FedAvg FedRep+LAG\ndatasets: MNIST\npartitions: dir0.1 -\nseeds: 0-1\n"
                    "clients: 7\nargs: -lbs 16\nargs.FedRep: -pls 2\nargs.FedRep+LAG: --lag_top_k 1\n")
    settings = settings_from_flags(["-g", str(grid), "-s", "3,3 2", "--results_dir", str(tmp_path), "--", "-lr", "1"])
    assert settings.goal == "small" and settings.seeds == [3, 2]
    plan = plan_runs(settings)
    assert list(plan.folders) == ["MNIST-dir0.1-nc7", "MNIST"]   # "-": the folder as it is, never generated
    assert plan.folders["MNIST"] is None and plan.folders["MNIST-dir0.1-nc7"] == ("MNIST", "dir0.1")
    assert [run.name for run in plan.runs][:2] == ["MNIST-dir0.1-nc7_FedAvg_small-CNN_3",
                                                    "MNIST-dir0.1-nc7_FedRep+LAG_small-CNN_3"]
    rep = plan.runs[1]
    assert rep.result_file == f"{tmp_path}/MNIST-dir0.1-nc7_FedRep+LAG_small-CNN_3.h5"
    assert " ".join(rep.main_flags).endswith("--seed 0 -pv 3 -t 4 --data_dir "
                                             f"{settings.data_dir} --results_dir {tmp_path} "
                                             "-lbs 16 -pls 2 --lag_top_k 1 -lr 1")
    assert "-pls" not in plan.runs[0].main_flags


def test_the_word_after_a_flag_is_its_value_and_help_stops_reading():
    assert parse_command_line(["-g", "--dry-run"]).grid.endswith("/--dry-run")
    assert parse_command_line(["-h", "--no-such-flag"]).show_help
    with pytest.raises(UsageError, match="unknown option '--jobs=2'"):
        parse_command_line(["--jobs=2"])
    with pytest.raises(UsageError, match="-a needs a value"):
        parse_command_line(["-a", ""])


@pytest.mark.parametrize("flags,message", [
    (["-s", "1-x"], "seed '1-x' is not a number or a range like 0-4"),
    (["-s", "5-3"], "the grid has no seeds"),
    (["-p", "dirx"], "unknown partition 'dirx'"),
    (["--goal", "a_b"], "goal 'a_b' may not contain '_' or '/'"),
    (["-j", "0"], "-j/--jobs must be a positive integer, got '0'"),
])
def test_bad_values_are_refused_before_anything_runs(flags, message, capsys):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        settings_from_flags(flags)
    assert main(flags) == 2 and f"run_all.sh: {message}" in capsys.readouterr().err


def test_summary_counts_each_outcome_and_sets_the_exit_status(tmp_path):
    settings = settings_from_flags(["-a", "A B C D E F", "-d", "Digits", "-p", "dir0.1", "-s", "0", "-m", "DNN",
                                    "-c", "20", "--timeout", "9", "--results_dir", str(tmp_path)])
    plan = plan_runs(settings)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / plan.runs[2].log_name).write_text("training\nerror: it broke\n\n")
    outcomes = {0: 0, 1: SKIPPED, 2: 2, 3: UNBUILT, 4: TIMED_OUT, 5: STOPPED}
    summary = summarize(settings, plan, Execution(outcomes=outcomes))
    assert summary.exit_code == 1
    lines = summary.lines()
    assert lines[0] == "run_all: 6 runs: 1 done, 1 skipped (complete), 4 failed"
    assert lines[1] == f"  FAILED {plan.runs[2].name} (exit 2): error: it broke"
    assert "(exit dataset Digits-dir0.1 not built)" in lines[3] and "(exit timed out after 9 s)" in lines[5]
    assert "(exit 143)" in lines[7]   # killed by someone else, not by stopping the batch: a failure

    stopped = summarize(settings, plan, Execution(outcomes={0: 0, 5: STOPPED}, interrupted=True))
    assert stopped.exit_code == 130
    assert stopped.lines()[0].endswith(", 0 failed, 1 stopped and 4 not started (interrupted: run again to continue)")


def test_runs_get_one_thread_unless_the_user_chose(monkeypatch):
    """Not cores / jobs (oversubscribed on a busy machine, and results that depend on -j): one intra-op
    thread per run, whatever -j; an OMP_NUM_THREADS the user exported is kept."""
    from grid.launcher import run_environment
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert run_environment()["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert run_environment()["OMP_NUM_THREADS"] == "3"
