"""What a report takes and how it labels it: only the flags an algorithm reads appear in a label, a goal
or a file-name pattern chooses the runs, and the quick grid shows FedLAG beside FedPer on concept shift."""
import numpy as np
import pytest

import report
from app.options import parse_args
from dataset.utils.naming import partition_from_config, partition_from_name
from flcore.flag_use import LAG_FLAGS, SHARED_HYPERPARAMETERS, unused_flags
from grid.cli import settings_from_flags
from grid.partitions import folder_name, generator_flags
from grid.plan import plan_runs
from reporting.grouping import group_runs
from reporting.runs import find_runs, load_runs
from reporting.tables import markdown_table, table_layout
from utils.result_utils import result_path, write_results


def write_run(folder, dataset, algorithm, goal, run, flags=(), acc=(0.4, 0.5)):
    """A run file whose config is every flag main.py records for ``flags`` (as a real run's is)."""
    config = parse_args(["-algo", algorithm, "-data", dataset, "-go", goal, *flags]).flags()
    path = result_path(folder, dataset, algorithm, goal, run)
    write_results(path, {"rs_test_acc": np.asarray(acc), "rs_eval_round": np.arange(len(acc))},
                  {"config": config, "run": run, "algorithm": algorithm, "dataset": dataset, "complete": True})
    return path


def layout(folder):
    rows, columns, _ = table_layout(group_runs(load_runs(find_runs([folder]))[0]))
    return [r.label for r in rows], [c.label for c in columns]


# ----- labels name what the algorithm reads ---------------------------------------------------------------
def test_unused_flags_follow_each_algorithms_declaration():
    config = parse_args([]).flags()
    assert unused_flags("FedAvg", config) == (SHARED_HYPERPARAMETERS | LAG_FLAGS)
    assert SHARED_HYPERPARAMETERS - unused_flags("FedProx", config) == {"mu"}
    assert SHARED_HYPERPARAMETERS - unused_flags("Ditto", config) == {"mu", "plocal_epochs"}
    # FedRep+LAG reads FedRep's flag and the LAG flags of the default schedule (smoothed: no warm-up).
    read = set(config) - unused_flags("FedRep+LAG", config)
    assert {"plocal_epochs", "lag_top_k", "lag_decay", "lag_margin"} <= read and "lag_warmup" not in read
    warmup = dict(config, lag_schedule="warmup")
    read = set(warmup) - unused_flags("FedLAG", warmup)
    assert "lag_warmup" in read and not {"lag_decay", "lag_margin"} & read
    assert unused_flags("SomeoneElsesMethod", config) == frozenset()   # unknown: any flag may matter


def test_columns_of_a_grid_and_a_stray_run_name_no_flag_their_algorithms_ignore(tmp_path):
    """The first report of a newcomer: the quick grid's FedAvg, Local and FedLAG at -gr 20 beside one
    test run of FedAvg at -gr 1. Every run records --lag_warmup (10 and 1), which no run here reads."""
    for algorithm in ("FedAvg", "Local", "FedLAG"):
        write_run(tmp_path, "Digits-dir0.1", algorithm, "quick-CNN", 0, ["-gr", "20", "-lr", "0.05"])
    write_run(tmp_path, "Digits-dir0.1-nc20", "FedAvg", "test", 0, ["-gr", "1"])
    rows, columns = layout(tmp_path)
    assert columns == ["Digits Dir(0.1) (-gr 20, -lr 0.05)", "Digits Dir(0.1) (-gr 1, -lr 0.005)"]
    assert rows == ["FedLAG", "FedAvg", "Local"]


def test_rows_of_one_method_name_the_lag_flags_only_where_its_schedule_reads_them(tmp_path):
    write_run(tmp_path, "MNIST-dir0.1", "FedLAG", "a", 0, ["-gr", "20"])              # --lag_warmup 10
    write_run(tmp_path, "MNIST-dir0.1", "FedLAG", "b", 0, ["-gr", "40"])              # --lag_warmup 20
    write_run(tmp_path, "MNIST-dir0.1", "FedProx", "a", 0, ["-gr", "20", "-mu", "0.1"])
    write_run(tmp_path, "MNIST-dir0.1", "FedProx", "b", 0, ["-gr", "20", "-mu", "0.01"])
    write_run(tmp_path, "MNIST-dir0.1", "FedAvg", "a", 0, ["-gr", "20", "-mu", "0.1"])  # -mu: not FedAvg's
    write_run(tmp_path, "MNIST-dir0.1", "FedAvg", "b", 0, ["-gr", "20", "-mu", "0.01"])
    rows, _ = layout(tmp_path)
    # -gr differs within the column, so every row names it (FedAvg (b) beside FedLAG (b; -gr 40) would read as
    # 40 rounds); -mu only where FedProx reads it, FedAvg's rows are one setting each.
    assert rows == ["FedLAG (a; -gr 20)", "FedAvg (a; -gr 20)", "FedProx (a; -gr 20, -mu 0.1)",
                    "FedLAG (b; -gr 40)", "FedAvg (b; -gr 20)", "FedProx (b; -gr 20, -mu 0.01)"]

    warm = tmp_path / "warmup"
    write_run(warm, "MNIST-dir0.1", "FedLAG", "a", 0, ["-gr", "20", "--lag_schedule", "warmup"])
    write_run(warm, "MNIST-dir0.1", "FedLAG", "b", 0, ["-gr", "40", "--lag_schedule", "warmup"])
    assert layout(warm)[0] == ["FedLAG (a; -gr 20, --lag_warmup 10)", "FedLAG (b; -gr 40, --lag_warmup 20)"]


def test_seeds_that_differ_in_a_flag_their_algorithm_reads_are_two_rows_and_in_one_it_ignores_one_cell(tmp_path):
    write_run(tmp_path, "MNIST-dir0.1", "FedAvg", "g", 0, ["-mu", "0.1"], acc=(0.4, 0.5))
    write_run(tmp_path, "MNIST-dir0.1", "FedAvg", "g", 1, ["-mu", "0.2"], acc=(0.4, 0.7))
    write_run(tmp_path, "MNIST-dir0.1", "FedProx", "g", 0, ["-mu", "0.1"], acc=(0.4, 0.5))
    write_run(tmp_path, "MNIST-dir0.1", "FedProx", "g", 1, ["-mu", "0.2"], acc=(0.4, 0.7))
    groups = group_runs(load_runs(find_runs([tmp_path]))[0])
    # FedAvg reads no -mu: its two runs are seeds of one cell, final (0.5 + 0.7) / 2 = 60.00 ± 10.00
    assert markdown_table(groups, "final").splitlines()[2:] == [
        "| FedAvg | 60.00 ± 10.00 |", "| FedProx (-mu 0.1) | 50.00 |", "| FedProx (-mu 0.2) | **70.00** |"]


# ----- which runs a report takes ----------------------------------------------------------------------------
@pytest.fixture
def mixed(tmp_path):
    """Two grid runs (goal quick, written by run_all as quick-CNN) and a stray test run."""
    folder = tmp_path / "results"
    write_run(folder, "Digits-iid-lg4", "FedAvg", "quick-CNN", 0, acc=(0.3, 0.6))
    write_run(folder, "Digits-iid-lg4", "FedLAG", "quick-CNN", 0, acc=(0.3, 0.8))
    write_run(folder, "Digits", "FedAvg", "test", 0, ["-gr", "1"], acc=(0.1, 0.2))
    return folder


def test_a_goal_takes_the_grids_runs_of_every_model(mixed, tmp_path, capsys):
    assert report.main([str(mixed), "-o", str(tmp_path / "r"), "--no-plots", "--goal", "quick"]) == 0
    table = (tmp_path / "r" / "table.md").read_text()
    assert "| method | Digits IID, 4 label groups |" in table
    assert "| FedLAG | **80.00** |" in table and "| FedAvg | 60.00 |" in table and "20.00" not in table
    assert "goals" not in capsys.readouterr().out   # one goal: nothing to point out


def test_a_file_name_pattern_takes_only_matching_runs(mixed, tmp_path):
    assert report.main([str(mixed), "-o", str(tmp_path / "r"), "--no-plots", "--include", "*_FedLAG_*",
                        "--include", "Digits_*"]) == 0
    lines = [line for line in (tmp_path / "r" / "summary.csv").read_text().splitlines()[1:]]
    assert sorted(line.split(",")[0] + " " + line.split(",")[3] for line in lines) == [
        "FedAvg Digits", "FedLAG Digits-iid-lg4"]


def test_a_report_of_several_goals_says_so_and_a_goal_that_is_not_there_lists_those_that_are(mixed, tmp_path,
                                                                                                capsys):
    assert report.main([str(mixed), "-o", str(tmp_path / "r"), "--no-plots"]) == 0
    assert ("runs of 2 goals: quick-CNN (2 runs), test (1 run); --goal NAME or --include GLOB takes some"
            in capsys.readouterr().out)
    assert report.main([str(mixed), "-o", str(tmp_path / "r"), "--goal", "quik"]) == 1
    err = capsys.readouterr().err
    assert err == f"error: no complete runs (.h5) in {mixed} with goal quik (there: quick-CNN (2 runs), test (1 run))\n"
    assert report.main([str(mixed), "-o", str(tmp_path / "r"), "--include", "*Cifar*"]) == 1
    assert capsys.readouterr().err == f"error: no complete runs (.h5) in {mixed} matching *Cifar*\n"


# ----- concept shift in grids and labels, and the quick grid ------------------------------------------------
def test_label_groups_are_a_grid_partition_and_a_column_label():
    assert generator_flags("iid-lg4") == ["iid", "-", "-", "--label-groups", "4"]
    assert generator_flags("dir0.5-lg2") == ["noniid", "-", "dir", "--alpha", "0.5", "--label-groups", "2"]
    assert generator_flags("iid-lg0") is None and generator_flags("lg4") is None
    assert folder_name("Digits", "iid-lg4", "40") == "Digits-iid-lg4-nc40"
    assert partition_from_name("Digits-iid-lg4-nc40") == ("iid-lg4", "IID, 4 label groups")
    assert partition_from_name("MNIST-dir0.1-nc7") == ("dir0.1", "Dir(0.1)")
    assert partition_from_config({"non_iid": True, "partition": "dir", "alpha": 0.1, "label_groups": 4}) == (
        "dir0.1-lg4", "Dir(0.1), 4 label groups")
    assert partition_from_config({"non_iid": False, "partition": "-", "label_groups": 1}) == ("iid", "IID")


def test_the_quick_grid_sets_fedlag_beside_fedper_on_concept_shift_in_a_few_runs():
    settings = settings_from_flags([])
    plan = plan_runs(settings)
    assert settings.algorithms == ["FedAvg", "Local", "FedPer", "FedLAG"]
    assert list(plan.folders) == ["Digits-iid-lg4-nc40"] and plan.folders["Digits-iid-lg4-nc40"] == ("Digits",
                                                                                                       "iid-lg4")
    # 8 runs x 31 rounds = 248 rounds over Digits' 1,335 training images, as the earlier 12 runs x 21 rounds
    # (252) that did not show what FedLAG is for; and 8 process starts instead of 12.
    assert len(plan.runs) == 8 and int(settings.rounds) + 1 == 31 and settings.clients == "40"
