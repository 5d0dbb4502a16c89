"""The report shows what the runs hold: each group of clients in its own colour, no label over runs of
different settings, a curve hidden under an equal one named, the mean over clients beside the weighted
accuracy, and every figure it does not draw named with why. Each figure is read back and compared with the
.h5 it was drawn from."""
import csv

import matplotlib.colors
import numpy as np
import pytest

import report
from app.options import parse_args
from reporting import plots
from reporting.grouping import group_runs, run_settings
from reporting.runs import find_runs, load_runs
from reporting.tables import markdown_table, table_layout
from utils.result_utils import read_results, result_path, write_results

LAYERS = ["base.conv.weight", "head.weight"]


def write_run(folder, dataset, algorithm, run, acc, flags=(), arrays=None, goal="g"):
    """A run file whose config is every flag main.py records for ``flags``, as a real run's is."""
    config = parse_args(["-algo", algorithm, "-data", dataset, "-go", goal, *flags]).flags()
    path = result_path(folder, dataset, algorithm, goal, run)
    write_results(path, {"rs_test_acc": np.asarray(acc, dtype=float), "rs_eval_round": np.arange(len(acc)),
                         **(arrays or {})},
                  {"config": config, "run": run, "algorithm": algorithm, "dataset": dataset, "complete": True})
    return path


def lag_arrays(groups):
    """FedLAG's records for ``groups`` (rounds x layers x clients): the head personal in every round where
    ``groups`` names groups for it, conflict scores and uploads of that many rounds."""
    groups = np.asarray(groups, dtype=np.int64)
    rounds = groups.shape[0]
    personal = (groups >= 0).any(axis=2) if groups.ndim == 3 else np.zeros((rounds, len(LAYERS)), dtype=bool)
    return {"lag_layer_names": np.array(LAYERS), "lag_conflict_scores": np.ones((rounds, len(LAYERS)), dtype=np.int64),
            "lag_personal": personal, "lag_num_uploads": np.full(rounds, 8), "lag_groups": groups}


def head_groups(rounds, last_round_groups):
    """lag_groups whose head is shared by all (-1) until the last round, which has ``last_round_groups``."""
    clients = len(last_round_groups)
    groups = np.full((rounds, len(LAYERS), clients), -1)
    groups[-1, 1] = last_round_groups
    return groups


def capture(monkeypatch, name):
    """Figures that report.py draws with ``plots.<name>``, kept for reading back."""
    drawn = []
    original = getattr(plots, name)

    def keep(*args, **kwargs):
        drawn.append(original(*args, **kwargs))
        return drawn[-1]
    monkeypatch.setattr(plots, name, keep)
    return drawn


# ----- each group of clients in a colour of its own --------------------------------------------------------------
def test_clients_share_a_colour_exactly_when_they_share_a_group(tmp_path, monkeypatch):
    """The quickstart's four label groups over 40 clients ([0 1 2 3 0 1 2 3 ...]) were drawn in two colours: a
    palette spread over 40 client ids gave groups 0 and 1 one colour, and 2 and 3 another."""
    last = np.tile([0, 1, 2, 3], 10)
    last[[7, 13]] = [7, 13]           # two clients alone in their groups
    path = write_run(tmp_path, "Digits-iid-lg4", "FedLAG", 0, [0.3, 0.5, 0.6], ["-nc", "40", "--lag_share", "groups"],
                     lag_arrays(head_groups(3, last)))
    drawn = capture(monkeypatch, "plot_client_groups")
    assert report.main([str(tmp_path), "-o", str(tmp_path / "rep")]) == 0
    assert len(drawn) == 1 and (tmp_path / "rep" / f"groups_{path.stem}_head.weight.png").exists()
    image = np.asarray(drawn[0].axes[0].images[0].get_array())   # clients x rounds x RGBA
    stored = read_results(path)[0]["lag_groups"][:, 1]             # rounds x clients, as the .h5 holds them
    assert image.shape == (40, 3, 4)
    assert (image[:, :2, 3] == 0).all()                            # shared by all: blank
    colours = [tuple(c) for c in image[:, -1]]
    in_group = [c for c in range(40) if c not in (7, 13)]
    for a in in_group:
        for b in in_group:
            assert (colours[a] == colours[b]) == (stored[-1, a] == stored[-1, b]), (a, b)
    assert len({colours[c] for c in in_group}) == 4
    assert colours[7] == colours[13] == plots.ALONE_COLOUR and plots.ALONE_COLOUR not in {colours[c] for c in in_group}
    legend = [t.get_text() for t in drawn[0].axes[0].get_legend().get_texts()]
    assert legend == ["group of client 0", "group of client 1", "group of client 2", "group of client 3", "alone"]


@pytest.mark.parametrize("count", [1, 4, 9, 10, 18, 19, 40, 200])
def test_group_colours_are_distinct_and_none_is_grey_for_any_number_of_groups(count):
    colours = plots.group_colours(count)
    assert len(colours) == count and len(set(colours)) == count
    saturation = matplotlib.colors.rgb_to_hsv(np.array([c[:3] for c in colours]))[:, 1]
    assert (saturation > 0.1).all()                                # grey means a client alone


# ----- no label over runs of different settings ------------------------------------------------------------------
def rows_and_columns(folder):
    rows, columns, cells = table_layout(group_runs(load_runs(find_runs([folder]))[0]))
    return [r.label for r in rows], [c.label for c in columns], cells


def test_runs_of_other_rounds_are_never_averaged_and_each_row_names_its_rounds(tmp_path):
    """Runs of 1, 50 and 100 rounds of one (dataset, algorithm, goal) were averaged as three seeds of one cell."""
    for run, (rounds, final) in enumerate(((1, 0.3), (50, 0.8), (100, 0.9))):
        write_run(tmp_path, "Digits-iid-lg4", "FedAvg", run, [0.1, final], ["-gr", str(rounds)])
    write_run(tmp_path, "Digits-iid-lg4", "FedLAG", 0, [0.1, 0.85], ["-gr", "50"])
    rows, columns, cells = rows_and_columns(tmp_path)
    assert columns == ["Digits IID, 4 label groups"]
    assert rows == ["FedLAG (-gr 50)", "FedAvg (-gr 1)", "FedAvg (-gr 50)", "FedAvg (-gr 100)"]
    assert all(len(g.runs) == 1 for g in cells.values())
    lines = markdown_table(group_runs(load_runs(find_runs([tmp_path]))[0]), "final").splitlines()[2:]
    assert lines == ["| FedLAG (-gr 50) | 85.00 |", "| FedAvg (-gr 1) | 30.00 |", "| FedAvg (-gr 50) | 80.00 |",
                     "| FedAvg (-gr 100) | **90.00** |"]


def test_group_sharing_is_a_row_of_its_own_named_by_its_flag(tmp_path):
    """A FedLAG run with --lag_share groups was averaged with one without, both under plain "FedLAG"."""
    write_run(tmp_path, "Digits-iid-lg4", "FedLAG", 0, [0.1, 0.9], ["--lag_share", "groups"])
    write_run(tmp_path, "Digits-iid-lg4", "FedLAG", 1, [0.1, 0.7])
    write_run(tmp_path, "Digits-iid-lg4", "FedAvg", 0, [0.1, 0.6], ["--lag_share", "groups"])  # FedAvg reads no --lag_*
    rows, _, cells = rows_and_columns(tmp_path)
    assert rows == ["FedLAG (--lag_share groups)", "FedLAG (--lag_share own)", "FedAvg"]
    assert {r.label: [run.run for run in g.runs] for (r, _), g in cells.items()} == {
        "FedLAG (--lag_share groups)": [0], "FedLAG (--lag_share own)": [1], "FedAvg": [0]}


def test_two_folders_of_one_split_never_share_a_header(tmp_path):
    """Digits-iid-lg4 and Digits-iid-lg4-nc40 (one split, one -nc) got one header once a third column made the
    report name a flag."""
    for dataset in ("Digits-iid-lg4", "Digits-iid-lg4-nc40"):
        write_run(tmp_path, dataset, "FedAvg", 0, [0.1, 0.5], ["-gr", "50", "-nc", "40"])
    _, columns, _ = rows_and_columns(tmp_path)
    assert columns == ["Digits IID, 4 label groups [Digits-iid-lg4]",
                       "Digits IID, 4 label groups [Digits-iid-lg4-nc40]"]
    write_run(tmp_path, "Digits-dir0.1", "FedAvg", 0, [0.1, 0.5], ["-gr", "20", "-nc", "40"])
    _, columns, _ = rows_and_columns(tmp_path)
    assert columns == ["Digits Dir(0.1) (-gr 20)", "Digits IID, 4 label groups (-gr 50) [Digits-iid-lg4]",
                       "Digits IID, 4 label groups (-gr 50) [Digits-iid-lg4-nc40]"]


def test_a_model_or_client_count_that_differs_within_a_column_names_its_rows(tmp_path):
    write_run(tmp_path, "MNIST-dir0.1", "FedAvg", 0, [0.1, 0.5], ["-m", "CNN"])
    write_run(tmp_path, "MNIST-dir0.1", "FedAvg", 1, [0.1, 0.6], ["-m", "DNN"])
    write_run(tmp_path, "MNIST-dir0.1", "FedLAG", 0, [0.1, 0.7], ["-m", "CNN", "-nc", "10"])
    rows, _, _ = rows_and_columns(tmp_path)
    assert rows == ["FedLAG (-m CNN, -nc 10)", "FedAvg (-m CNN, -nc 20)", "FedAvg (-m DNN, -nc 20)"]


def test_no_two_cells_hold_runs_of_the_same_labels_and_each_cell_one_setting(tmp_path):
    """A folder of mixed runs: rounds, LAG sharing, model and dataset folders; every (row, column) label
    pair is one group, and every run under it has that group's settings."""
    specs = [("Digits-iid-lg4", "FedLAG", 0, ["-gr", "50", "--lag_share", "groups"]),
             ("Digits-iid-lg4", "FedLAG", 1, ["-gr", "50"]), ("Digits-iid-lg4", "FedLAG", 2, ["-gr", "50"]),
             ("Digits-iid-lg4", "FedAvg", 0, ["-gr", "1"]), ("Digits-iid-lg4", "FedAvg", 1, ["-gr", "100"]),
             ("Digits-iid-lg4-nc40", "FedAvg", 0, ["-gr", "50"]), ("Digits-iid-lg4-nc40", "FedPer", 0, ["-gr", "50"]),
             ("Digits-iid-lg4-nc40", "FedPer", 1, ["-gr", "50", "-m", "DNN"])]
    for dataset, algorithm, run, flags in specs:
        write_run(tmp_path, dataset, algorithm, run, [0.2, 0.5], flags)
    rows, columns, cells = rows_and_columns(tmp_path)
    labels = [(r.label, c.label) for r, c in cells]
    assert len(labels) == len(set(labels)) == 7                   # FedLAG runs 1 and 2 are seeds of one cell
    assert len(set(rows)) == len(rows) and len(set(columns)) == len(columns)
    for g in cells.values():
        assert all(run_settings(r) == g.settings for r in g.runs)


def test_summary_csv_names_each_experiment_by_its_labels(tmp_path):
    write_run(tmp_path, "Digits-iid-lg4", "FedLAG", 0, [0.1, 0.9], ["--lag_share", "groups"])
    write_run(tmp_path, "Digits-iid-lg4", "FedLAG", 1, [0.1, 0.7])
    assert report.main([str(tmp_path), "-o", str(tmp_path / "rep"), "--no-plots"]) == 0
    summary = list(csv.DictReader(open(tmp_path / "rep" / "summary.csv")))
    assert [(r["method"], r["run_ids"], float(r["final_mean"])) for r in summary] == [
        ("FedLAG (--lag_share groups)", "0", 0.9), ("FedLAG (--lag_share own)", "1", 0.7)]


# ----- a curve hidden under an equal one is named -----------------------------------------------------------------
def test_a_curve_equal_to_an_earlier_one_is_drawn_over_it_and_named(tmp_path, monkeypatch):
    """FedPer's curve equal to FedLAG's lay exactly under FedLAG's black line, and the legend did not say so."""
    for dataset in ("Digits-iid-lg4", "MNIST-dir0.1"):
        for run in (0, 1):
            write_run(tmp_path, dataset, "FedLAG", run, [0.2, 0.6 + run / 10])
            write_run(tmp_path, dataset, "FedPer", run, [0.2, 0.6 + run / 10])
            write_run(tmp_path, dataset, "FedAvg", run, [0.2, 0.4 + run / 10])
    curves = capture(monkeypatch, "plot_accuracy_curves")
    overview = capture(monkeypatch, "plot_accuracy_overview")
    assert report.main([str(tmp_path), "-o", str(tmp_path / "rep")]) == 0
    ax = curves[0].axes[0]
    lines = {line.get_label(): line for line in ax.lines}
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["FedLAG (n=2)", "FedAvg (n=2)",
                                                                   "FedPer (= FedLAG, n=2)"]
    lag, per = lines["FedLAG (n=2)"], lines["FedPer (= FedLAG, n=2)"]
    assert np.array_equal(per.get_ydata(), lag.get_ydata()) and np.allclose(per.get_ydata(), [20, 65])
    # drawn over FedLAG in dashes, in a colour of its own: both show
    assert per.get_zorder() > lag.get_zorder() and per.get_linestyle() != "-" and per.get_color() != lag.get_color()
    assert "FedAvg (n=2)" in lines and lines["FedAvg (n=2)"].get_linestyle() == "-"
    assert [t.get_text() for t in overview[0].legends[0].get_texts()] == ["FedLAG", "FedAvg", "FedPer (= FedLAG)"]


def test_a_curve_held_by_a_longer_one_is_named_and_of_two_equal_curves_the_later():
    def curve(values, start=0):
        return np.arange(start, start + len(values)), np.asarray(values), np.zeros(len(values)), np.ones(len(values))
    curves = {"FedAvg (-gr 1)": curve([0.1, 0.3]), "FedAvg (-gr 3)": curve([0.1, 0.3, 0.4, 0.5]),
              "FedProx": curve([0.1, 0.3, 0.4, 0.5]), "Local": curve([0.3, 0.4], start=1), "Ditto": curve([0.1, 0.2])}
    assert plots.repeated_curves(curves) == {"FedAvg (-gr 1)": "FedAvg (-gr 3)", "FedProx": "FedAvg (-gr 3)",
                                             "Local": "FedAvg (-gr 3)"}


# ----- the mean over clients beside the weighted accuracy --------------------------------------------------------
# Three clients holding 8, 1 and 1 of every 10 test samples; two seeds, k = 2.
# Seed 0: clients [0.6, 0.3, 0.3] then [0.9, 0.2, 0.4]: weighted (4.8 + 0.6) / 10 = 0.54, then
#   (8 * 0.9 + 0.2 + 0.4) / 10 = 0.78 (last 2: 0.66); mean over clients 1.2 / 3 = 0.4, then 1.5 / 3 = 0.5
#   (last 2: 0.45).
# Seed 1: clients [0.6, 0.3, 0.3] then [0.8, 0.5, 0.5]: weighted 0.54, then (6.4 + 1.0) / 10 = 0.74 (last 2:
#   0.64); mean over clients 0.4, then 1.8 / 3 = 0.6 (last 2: 0.5).
# Over seeds: weighted final 0.76 ± 0.02, its last-2 0.65 ± 0.01; mean over clients 0.55 ± 0.05, its last-2
# 0.475 ± 0.025.
CLIENTS = {0: [[0.6, 0.3, 0.3], [0.9, 0.2, 0.4]], 1: [[0.6, 0.3, 0.3], [0.8, 0.5, 0.5]]}
SAMPLES = np.array([8, 1, 1])


def test_the_tables_show_the_mean_over_clients_beside_the_weighted_accuracy(tmp_path):
    paths = []
    for seed, table in CLIENTS.items():
        table = np.array(table)
        weighted = table @ SAMPLES / SAMPLES.sum()
        paths.append(write_run(tmp_path, "Digits-iid-lg4", "FedAvg", seed, weighted, ["--report_last_k", "2"],
                               {"rs_client_acc": table}))
    assert report.main([str(tmp_path), "-o", str(tmp_path / "rep"), "--no-plots"]) == 0
    tables = (tmp_path / "rep" / "table.md").read_text()
    headings = [line[3:] for line in tables.splitlines() if line.startswith("## ")]
    assert headings[1:5] == ["Final accuracy (%): last evaluation",
                             "Final accuracy, mean over clients (%): each client's accuracy at the last evaluation, "
                             "unweighted",
                             "Mean accuracy of the last 2 evaluations (%)",
                             "Mean over clients of the last 2 evaluations (%): each client's accuracy, unweighted"]
    cells = [line for line in tables.splitlines() if line.startswith("| FedAvg")]
    assert cells[1:5] == ["| FedAvg | 76.00 ± 2.00 |", "| FedAvg | 55.00 ± 5.00 |", "| FedAvg | 65.00 ± 1.00 |",
                          "| FedAvg | 47.50 ± 2.50 |"]
    rows = list(csv.reader(open(tmp_path / "rep" / "table.csv")))
    column = rows[0].index("Digits IID, 4 label groups final client mean")
    assert rows[0][column - 1].endswith(" final") and rows[1][column] == "55.00 ± 5.00"
    # the same from the files themselves: each client's accuracy counted once
    finals = [read_results(p)[0]["rs_client_acc"][-1].mean() for p in paths]
    summary = next(csv.DictReader(open(tmp_path / "rep" / "summary.csv")))
    assert float(summary["final_client_mean_mean"]) == pytest.approx(np.mean(finals)) == pytest.approx(0.55)
    assert float(summary["last_k_client_mean_mean"]) == pytest.approx(0.475)


def test_the_mean_over_clients_is_na_where_the_run_recorded_no_clients(tmp_path):
    write_run(tmp_path, "Digits-iid-lg4", "FedAvg", 0, [0.4, 0.5])   # PFLlib's files hold no rs_client_acc
    assert report.main([str(tmp_path), "-o", str(tmp_path / "rep"), "--no-plots"]) == 0
    rows = list(csv.reader(open(tmp_path / "rep" / "table.csv")))
    assert rows[1][rows[0].index("Digits IID, 4 label groups final client mean")] == "n/a"


# ----- a figure not drawn is named, with why ---------------------------------------------------------------------
def groups_run(folder, groups, flags=("-nc", "8", "--lag_share", "groups"), run=0):
    arrays = lag_arrays(groups)
    arrays["lag_scored"] = np.ones(len(arrays["lag_conflict_scores"]), dtype=bool)
    return write_run(folder, "Digits-iid-lg4", "FedLAG", run, [0.3, 0.5, 0.6, 0.7], list(flags), arrays)


def report_lines(folder, capsys, *flags):
    assert report.main([str(folder), "-o", str(folder / "rep"), *flags]) == 0
    printed = capsys.readouterr().out
    return [line for line in printed.splitlines() if line.startswith("figure not drawn: ")], printed


def test_lag_groups_of_more_clients_than_the_run_had_are_refused_in_one_line(tmp_path, capsys):
    """An 8-client run whose lag_groups held 99 clients was drawn with 99 rows."""
    path = groups_run(tmp_path, head_groups(4, np.tile([0, 1, 2], 33)))
    lines, printed = report_lines(tmp_path, capsys)
    assert lines == [f"figure not drawn: groups of {path.name}: lag_groups has 99 clients, the run 8 (-nc 8)"]
    assert not list((tmp_path / "rep").glob("groups_*.png"))
    assert "| FedLAG | 70.00 |" in printed                          # the run itself is reported
    page = (tmp_path / "rep" / "report.md").read_text()
    assert f"## Figures not drawn\n\n- groups of {path.name}: lag_groups has 99 clients, the run 8 (-nc 8)" in page


@pytest.mark.parametrize("groups, why", [
    (head_groups(6, np.tile([0, 1], 4)), "lag_groups has 6 rounds x 2 layers, lag_conflict_scores 4 x 2"),
    (np.zeros((4, 8)), "lag_groups has shape (4, 8), not rounds x layers x clients"),
    (head_groups(4, [0, 1, 0, 1, 0, 1, 0, 9]), "lag_groups holds group 9, not -1 or one of the 8 client ids"),
])
def test_lag_groups_that_do_not_fit_the_run_are_refused_with_what_is_wrong(groups, why, tmp_path, capsys):
    path = groups_run(tmp_path, groups)
    if groups.ndim == 3 and groups.shape[0] != 4:   # conflict records of 4 rounds beside 6 rounds of groups
        arrays, attrs = read_results(path)
        arrays.update({k: v[:4] for k, v in arrays.items() if k.startswith("lag_") and k != "lag_groups"
                       and k != "lag_layer_names"})
        write_results(path, arrays, attrs)
    lines, _ = report_lines(tmp_path, capsys)
    assert lines == [f"figure not drawn: groups of {path.name}: {why}"]


def test_every_figure_not_drawn_is_named(tmp_path, capsys):
    """A group-sharing run without lag_groups, a fraction heatmap without uploads: each one line, no traceback."""
    arrays = lag_arrays(head_groups(2, np.tile([0, 1], 4)))
    del arrays["lag_groups"], arrays["lag_num_uploads"]
    path = write_run(tmp_path, "Digits-iid-lg4", "FedLAG", 0, [0.3, 0.5], ["--lag_share", "groups"], arrays)
    lines, _ = report_lines(tmp_path, capsys, "--heatmap-scale", "fraction")
    assert lines == [
        f"figure not drawn: heatmap of {path.name}: --heatmap-scale fraction needs lag_num_uploads, one per round, "
        f"and the file has 0 for 2 rounds",
        f"figure not drawn: groups of {path.name}: the run shared within groups but recorded no lag_groups"]


def test_an_overview_of_too_many_algorithms_is_named_as_not_drawn(tmp_path, capsys):
    many = ["FedAvg", "Local", "FedPer", "FedRep", "FedBABU", "FedROD", "FedBN", "FedProx", "Ditto"]
    assert len(many) > plots.PANEL_LIMIT
    for algorithm in many:
        write_run(tmp_path, "MNIST-dir0.1", algorithm, 0, [0.3, 0.5])
    write_run(tmp_path, "Cifar10-dir0.1", "MOON", 0, [0.3, 0.5])  # no algorithm run on both
    lines, _ = report_lines(tmp_path, capsys)
    assert lines == [f"figure not drawn: curves.png (every dataset side by side): 10 algorithms, more than "
                     f"{plots.PANEL_LIMIT} for one figure, and 0 of them run on every dataset; each "
                     f"curves_<dataset>.png shows its own"]
    assert sorted(p.name for p in (tmp_path / "rep").glob("curves*.png")) == ["curves_Cifar10-dir0.1.png",
                                                                             "curves_MNIST-dir0.1.png"]


def test_well_formed_groups_are_drawn_and_nothing_is_reported_missing(tmp_path, capsys):
    groups_run(tmp_path, head_groups(4, [0, 1, 0, 1, 0, 1, 2, 3]))
    write_run(tmp_path, "Digits-iid-lg4", "FedAvg", 0, [0.3, 0.5], ["--lag_share", "groups"])  # reads no --lag_*
    lines, _ = report_lines(tmp_path, capsys)
    assert lines == [] and len(list((tmp_path / "rep").glob("groups_*.png"))) == 1


def test_lag_groups_without_conflict_scores_are_named_too(tmp_path, capsys):
    path = write_run(tmp_path, "Digits-iid-lg4", "FedLAG", 0, [0.3, 0.5], ["--lag_share", "groups"],
                     {"lag_groups": head_groups(2, np.tile([0, 1], 4))})
    lines, _ = report_lines(tmp_path, capsys)
    assert lines == [f"figure not drawn: groups of {path.name}: lag_groups without conflict scores "
                     f"(lag_conflict_scores) to match its rounds and layers"]
