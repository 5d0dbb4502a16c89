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
    (["-s", "5-3"], "seed range '5-3' runs backwards (write 3-5)"),
    (["-s", ","], "the grid has no seeds"),
    (["-p", "dirx"], "unknown partition 'dirx'"),
    (["--goal", "a_b"], "goal 'a_b' may not contain '_' or '/'"),
    (["-j", "0"], "-j/--jobs must be a positive integer, got '0'"),
])
def test_bad_values_are_refused_before_anything_runs(flags, message, capsys):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        settings_from_flags(flags)
    assert main(flags) == 2 and f"run_all.sh: {message}" in capsys.readouterr().err


def test_summary_counts_each_outcome_and_sets_the_exit_status(tmp_path):
    settings = settings_from_flags(["-a", "FedAvg Local FedPer FedRep FedProx Ditto", "-d", "Digits", "-p", "dir0.1", "-s", "0", "-m", "DNN",
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


# Each one word: blanks separate the values of a list (a goal is one value: it gets blanks too).
HOSTILE_NAMES = ["../../../X", "a/b", "..", "*", "a?b", "$(touch", "`id`", "a;b", "'", "\\x", "a|b", "~"]


@pytest.mark.parametrize("value", HOSTILE_NAMES, ids=repr)
@pytest.mark.parametrize("flag, kind", [("-a", "algorithm"), ("-d", "dataset"), ("-m", "model"), ("--goal", "goal")])
def test_a_name_that_is_not_a_plain_file_name_is_refused_before_any_file_is_opened(flag, kind, value, tmp_path, capsys,
                                                                                monkeypatch):
    """main.py's rule for names, in the batch, before the logs: '../../../X' as a dataset would have opened
    (and truncated) a log three folders above <results>/logs/."""
    monkeypatch.chdir(tmp_path)
    results = tmp_path / "deep" / "er" / "results"
    flags = [flag, value, "-p", "-", "-r", "1", "-s", "0", "--results_dir", str(results), "--data_dir", "data"]
    assert main(flags) == 2
    err = capsys.readouterr().err
    if kind == "goal" and "/" in value:
        assert err == f"run_all.sh: goal '{value}' may not contain '_' or '/' (it is part of file names)\n"
    else:
        assert err.startswith(f"run_all.sh: {kind} {value!r} ") and len(err.splitlines()) == 1, err
        assert err.endswith("; it is part of a file name: use a plain name (letters, digits, '-', '.', '_', '+')\n")
    assert list(tmp_path.iterdir()) == []  # no log, no folder, anywhere


@pytest.mark.parametrize("goal", ["x\ny", "a b", "a\tb"], ids=repr)
def test_a_goal_with_blanks_is_refused_too(goal, capsys):
    assert main(["--goal", goal, "--dry-run"]) == 2
    assert capsys.readouterr().err.startswith(f"run_all.sh: goal {goal!r} contains the character ")


OWNED = [(["--results_dir", "OTHER"], "--results_dir", "--results_dir"),
         (["--results", "O"], "--results_dir", "--results_dir"),
         (["-go", "x"], "-go/--goal", "--goal"), (["--goal=x"], "-go/--goal", "--goal"),
         (["-t", "3"], "-t/--times", "-s/--seeds"), (["-pv", "1"], "-pv/--prev", "-s/--seeds"),
         (["--seed", "3"], "--seed", "-s/--seeds"), (["-gr", "5"], "-gr/--global_rounds", "-r/--rounds"),
         (["-nc", "3"], "-nc/--num_clients", "-c/--clients"), (["-jr", "0.5"], "-jr/--join_ratio", "--jr"),
         (["-m", "DNN"], "-m/--model", "-m/--models"), (["-algo", "FedProx"], "-algo/--algorithm", "-a/--algorithms"),
         (["-data", "MNIST"], "-data/--dataset", "-d/--datasets (with -p/--partitions)"),
         (["--data_dir", "D"], "--data_dir", "--data_dir")]
PLACES = ["after --", "in the grid's args:", "in the grid's args.FedAvg:"]


def batch_with(place: str, flags, tmp_path) -> list:
    """run_all.sh's flags passing ``flags`` to main.py from ``place``."""
    grid = tmp_path / "g.grid"
    lines = {"after --": "", "in the grid's args:": f"args: {' '.join(flags)}\n",
             "in the grid's args.FedAvg:": f"args.FedAvg: {' '.join(flags)}\n"}
    grid.write_text("algorithms: FedAvg FedRep\n" + lines[place])
    return ["-g", str(grid), "--results_dir", str(tmp_path / "r")] + (["--", *flags] if place == "after --" else [])


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("flags, names, batch_flag", OWNED, ids=[" ".join(f) for f, _, _ in OWNED])
def test_a_main_flag_the_batch_sets_itself_is_refused_with_the_batch_flag_to_use(flags, names, batch_flag, place,
                                                                               tmp_path, capsys):
    """Passed on to main.py it would move the run's results (or change its flags) behind the batch's back:
    the batch would say done, and run it again next time."""
    argv = batch_with(place, flags, tmp_path)
    assert main(argv) == 2
    assert capsys.readouterr().err == (f"run_all.sh: {names} {place} would override what the batch sets in every "
                                       f"run, which would then write its results elsewhere, or under other flags, "
                                       f"than the batch looks for; use run_all.sh's {batch_flag} instead\n")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("flags", [["-lbs", "16"], ["-dev", "cpu"], ["-tc", "5"], ["--lag_top_k", "2"],
                                   ["--checkpoint_every", "5"], ["-ls", "2", "--threads", "2"]])
def test_main_flags_the_batch_does_not_set_pass_through(flags, tmp_path):
    for place in PLACES:
        settings = settings_from_flags(batch_with(place, flags, tmp_path))
        fedavg = plan_runs(settings).runs[0]
        assert fedavg.main_flags[-len(flags):] == tuple(flags)


def test_flags_main_cannot_read_are_refused_before_anything_runs(tmp_path, capsys):
    assert main(batch_with("after --", ["-lbs", "x"], tmp_path)) == 2
    assert capsys.readouterr().err == ("run_all.sh: main.py cannot read the flags after -- (argument "
                                       "-lbs/--batch_size: invalid int value: 'x')\n")


def test_shifted_partitions_name_their_folders_and_generate_them_with_the_shift(tmp_path, monkeypatch):
    """``iid-lg2``/``dir0.1-rot4`` partitions: folder D-P[-nc<N>] (as main.py reads the name back), built by
    the generator with the shift's flags; a shifted folder given as a dataset with ``-`` is used as it is."""
    import subprocess
    from dataset import generate_Digits
    from dataset.utils.command_line import main as generate_main
    from dataset.utils.client_files import read_config
    from grid.datasets import build_datasets
    from utils.dataset_hints import split_from_name
    flags = ["-c", "6", "-s", "0", "-a", "FedAvg", "--data_dir", str(tmp_path), "--results_dir", str(tmp_path)]
    as_is = plan_runs(settings_from_flags(["-d", "Digits-iid-cor4", "-p", "-", *flags]))
    assert as_is.folders == {"Digits-iid-cor4": None} and "Digits-iid-cor4" in as_is.runs[0].main_flags
    settings = settings_from_flags(["-d", "Digits", "-p", "iid-lg2-rot2", *flags])
    plan = plan_runs(settings)
    assert plan.folders == {"Digits-iid-lg2-rot2-nc6": ("Digits", "iid-lg2-rot2")}
    commands = []
    monkeypatch.setattr(subprocess, "run", lambda command, **kw: commands.append(command) or
                        subprocess.CompletedProcess(command, 0))
    (tmp_path / "logs").mkdir()
    build_datasets(settings, plan, ["pending"] * len(plan.runs))
    argv = commands[0][2:]
    assert argv[:7] == ["iid", "-", "-", "--label-groups", "2", "--feature-groups", "2"]
    assert generate_main("Digits", generate_Digits.load_raw, argv, defaults=generate_Digits.DIGITS_DEFAULT) == 0
    config = read_config(tmp_path / "Digits-iid-lg2-rot2-nc6")
    expected = split_from_name("Digits-iid-lg2-rot2-nc6", 20)
    assert {key: config[key] for key in expected} == expected
    with pytest.raises(UsageError, match="unknown partition 'iid-rot2-lg2'"):
        settings_from_flags(["-p", "iid-rot2-lg2"])   # the label shift comes first, as in folder names
