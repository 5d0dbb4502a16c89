"""Tables and plots of a batch: numbers checked by hand on synthetic .h5 files written with write_results."""
import csv
import json
from types import SimpleNamespace

import numpy as np
import pytest

import report
from reporting import plots
from reporting.grouping import dataset_partition, group_runs, run_settings
from reporting.runs import find_runs, load_runs
from reporting.statistics import recorded_last_k
from reporting.tables import markdown_table, models_note, personal_frequency, summary_rows
from utils.accuracy_summary import summary_from_arrays
from utils.result_utils import read_results, result_path, write_results
from app.run_status import run_status

# Three seeds of one experiment: best = (0.6, 0.7, 0.8), final = (0.5, 0.7, 0.75).
# best: mean 0.70, population std sqrt((0.01 + 0 + 0.01) / 3) = 0.0816497
# final: mean 0.65, population std sqrt((0.0225 + 0.0025 + 0.01) / 3) = 0.1080123
SEEDS = ([0.10, 0.60, 0.50], [0.20, 0.70, 0.70], [0.30, 0.80, 0.75])
LAYERS = ["base.conv.weight", "base.conv.bias", "head.weight"]
SCORES = np.array([[0, 3, 6], [1, 2, 6], [5, 0, 4], [2, 2, 2]])      # rounds x layers
PERSONAL = np.array([[1, 0, 1], [0, 1, 1], [1, 0, 1], [1, 0, 0]], dtype=bool)


def write_run(folder, dataset, algorithm, run, acc, complete=True, goal="g", lag=False, config=None):
    arrays = {"rs_test_acc": np.asarray(acc), "rs_eval_round": np.arange(len(acc)),
              "rs_train_loss": np.ones(len(acc))}
    if lag:
        arrays.update({"lag_layer_names": np.array(LAYERS), "lag_conflict_scores": SCORES,
                       "lag_personal": PERSONAL, "lag_num_uploads": np.array([4, 4, 4, 3])})
    cfg = {"dataset": dataset, "algorithm": algorithm, "goal": goal, "model": "CNN", "seed": run,
           "lag_xi": 0.0, "lag_top_k": 1, **(config or {})}
    path = result_path(folder, dataset, algorithm, goal, run)
    write_results(path, arrays, {"config": cfg, "run": run, "algorithm": algorithm, "dataset": dataset,
                                 "complete": complete, "rounds_done": len(acc)})
    return path


@pytest.fixture
def batch(tmp_path):
    """FedAvg and FedLAG on MNIST Dir(0.1) and Dir(1.0); FedLAG runs carry conflict records."""
    folder = tmp_path / "results"
    for i, acc in enumerate(SEEDS):
        write_run(folder, "MNIST-dir0.1", "FedAvg", i, acc)
        write_run(folder, "MNIST-dir0.1", "FedLAG", i, [a + 0.1 for a in acc], lag=True)
    write_run(folder, "MNIST-dir1.0", "FedAvg", 0, [0.2, 0.4])
    write_run(folder, "MNIST-dir1.0", "FedLAG", 0, [0.2, 0.3])
    write_run(folder, "MNIST-dir0.1", "FedAvg", 3, [0.9, 0.99], complete=False)  # diverged: left out
    return folder


def test_table_numbers_equal_a_hand_computation(batch):
    runs, left_out = load_runs(find_runs([batch]))
    assert [p.name for p, _ in left_out] == ["MNIST-dir0.1_FedAvg_g_3.h5"]
    records = {(r["algorithm"], r["dataset"]): r for r in summary_rows(group_runs(runs))}
    avg = records[("FedAvg", "MNIST-dir0.1")]
    assert avg["runs"] == 3 and avg["run_ids"] == "0 1 2" and avg["partition"] == "dir0.1"
    assert avg["best_mean"] == pytest.approx(0.70) and avg["best_std"] == pytest.approx(0.0816497, abs=1e-7)
    assert avg["final_mean"] == pytest.approx(0.65) and avg["final_std"] == pytest.approx(0.1080123, abs=1e-7)
    lag = records[("FedLAG", "MNIST-dir0.1")]
    assert lag["best_mean"] == pytest.approx(0.80) and lag["final_mean"] == pytest.approx(0.75)
    one = records[("FedAvg", "MNIST-dir1.0")]
    assert (one["best_mean"], one["best_std"], one["final_mean"]) == (pytest.approx(0.4), 0.0, pytest.approx(0.4))


def test_markdown_is_table1_layout_with_the_best_in_bold(batch):
    runs, _ = load_runs(find_runs([batch]))
    lines = markdown_table(group_runs(runs), "best").splitlines()
    assert lines[0] == "| method | MNIST Dir(0.1) | MNIST Dir(1) |"
    assert lines[2] == "| FedLAG | **80.00 ± 8.16** | 30.00 |"
    assert lines[3] == "| FedAvg | 70.00 ± 8.16 | **40.00** |"
    final = markdown_table(group_runs(runs), "final").splitlines()
    assert final[3] == "| FedAvg | 65.00 ± 10.80 | **40.00** |"


def test_partition_comes_from_the_dataset_config_when_there_is_one(tmp_path):
    data = tmp_path / "data"
    (data / "c10small").mkdir(parents=True)
    (data / "c10small" / "config.json").write_text(json.dumps(
        {"non_iid": True, "partition": "pat", "class_per_client": 3, "source": "Cifar10"}))
    part = dataset_partition("c10small", data)
    assert (part.key, part.label) == ("pat3", "Pat(3)")
    (data / "Cifar10-dir0.5").mkdir()
    (data / "Cifar10-dir0.5" / "config.json").write_text(json.dumps(
        {"non_iid": False, "partition": "iid", "source": "Cifar10"}))
    part = dataset_partition("Cifar10-dir0.5", data)  # the config wins over the name
    assert (part.base, part.key, part.label) == ("Cifar10", "iid", "IID")
    assert dataset_partition("Toy", data).key == ""   # neither: the folder name is the column


def test_report_command_writes_tables_and_plots(batch, tmp_path, capsys):
    out = tmp_path / "rep"
    assert report.main([str(batch), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| FedAvg | 70.00 ± 8.16 |" in printed and "left out MNIST-dir0.1_FedAvg_g_3.h5" in printed
    rows = list(csv.reader(open(out / "table.csv")))
    stats = ["best", "final", "final client mean", "last-10 mean", "last-10 client mean", "final worst-10%",
             "final client std"]
    assert rows[0] == ["method"] + [f"{c} {m}" for c in ("MNIST Dir(0.1)", "MNIST Dir(1)") for m in stats]
    # last-10 of 3 evaluations averages all three: seeds 0.4, 0.5333, 0.6167 -> mean 0.5167, population std
    # sqrt((0.11667^2 + 0.01667^2 + 0.1^2) / 3) = 0.0892; the runs recorded no rs_client_acc: n/a
    assert rows[2] == ["FedAvg", "70.00 ± 8.16", "65.00 ± 10.80", "n/a", "51.67 ± 8.92", "n/a", "n/a", "n/a",
                       "40.00", "40.00", "n/a", "30.00", "n/a", "n/a", "n/a"]
    summary = list(csv.DictReader(open(out / "summary.csv")))
    assert float(summary[1]["final_std"]) == pytest.approx(0.1080123, abs=1e-7)
    pngs = sorted(p.name for p in out.glob("*.png"))
    # curves per dataset and side by side; one heatmap (first seed) and one frequency plot for FedLAG only
    assert pngs == ["curves.png", "curves_MNIST-dir0.1.png", "curves_MNIST-dir1.0.png",
                    "heatmap_MNIST-dir0.1_FedLAG_g_0.png", "personal_MNIST-dir0.1_FedLAG_g.png"]
    page = (out / "report.md").read_text()
    assert "![curves](curves.png)" in page and "Runs left out" in page
    assert report.main([str(batch), "-o", str(out / "all"), "--all-heatmaps", "--goal", "g"]) == 0
    assert len(list((out / "all").glob("heatmap_*.png"))) == 3
    assert report.main([str(batch), "-o", str(out / "none"), "--goal", "other"]) == 1


def test_heatmap_is_layers_by_rounds_with_labels():
    fig = plots.plot_conflict_heatmap(LAYERS, SCORES, "conflicts", personal=PERSONAL)
    ax = fig.axes[0]
    image = ax.images[0].get_array()
    assert image.shape == (3, 4)                           # layers x rounds
    assert np.array_equal(np.asarray(image), SCORES.T)
    assert [t.get_text() for t in ax.get_yticklabels()] == LAYERS
    assert ax.get_xlabel().startswith("round") and "layer" in ax.get_ylabel()
    assert ax.get_title() == "conflicts"
    assert "conflicting client pairs" in fig.axes[1].get_ylabel()  # the colour bar
    marks = ax.collections[0].get_offsets()
    assert sorted(map(tuple, np.asarray(marks).tolist())) == sorted(
        (float(r), float(l)) for r, l in zip(*np.nonzero(PERSONAL)))


def test_heatmap_normalised_by_client_pairs():
    fig = plots.plot_conflict_heatmap(LAYERS, SCORES, "t", uploads=np.array([4, 4, 4, 3]), normalise=True)
    pairs = np.array([6, 6, 6, 3])
    assert np.allclose(np.asarray(fig.axes[0].images[0].get_array()), SCORES.T / pairs)
    assert fig.axes[1].get_ylabel() == "fraction of client pairs in conflict"
    with pytest.raises(ValueError):
        plots.plot_conflict_heatmap(LAYERS[:2], SCORES, "t")


def test_personal_frequency_and_curves(batch):
    runs, _ = load_runs(find_runs([batch]))
    lag = [r for r in runs if r.algorithm == "FedLAG" and r.dataset == "MNIST-dir0.1"]
    names, mean, std, averaged = personal_frequency(lag)
    assert names == LAYERS and np.allclose(mean, [0.75, 0.25, 0.75]) and np.allclose(std, 0) and averaged == 3
    fig = plots.plot_personal_frequency(names, mean, std, "t")
    assert [p.get_width() for p in fig.axes[0].patches] == pytest.approx([0.75, 0.25, 0.75])
    group = next(g for g in group_runs(runs) if g.algorithm == "FedAvg" and g.dataset == "MNIST-dir0.1")
    rounds, mean, std, count = group.curve()
    assert rounds.tolist() == [0, 1, 2] and count.tolist() == [3, 3, 3]
    assert np.allclose(mean, [0.2, 0.7, 0.65]) and np.allclose(std[0], np.std([0.1, 0.2, 0.3]))
    fig = plots.plot_accuracy_curves({"FedAvg": group.curve(), "FedAvg+LAG": group.curve()}, "t")
    ax = fig.axes[0]
    assert [line.get_linestyle() for line in ax.lines] == ["-", "--"]   # X+LAG dashed, X's colour
    assert ax.lines[0].get_color() == ax.lines[1].get_color()
    assert np.allclose(ax.lines[0].get_ydata(), [20, 70, 65]) and len(ax.collections) == 2  # std shaded


def test_run_status(batch):
    argv = ["-algo", "FedAvg", "-data", "MNIST-dir0.1", "-go", "g", "-m", "CNN", "-pv", "1", "-t", "2"]
    assert run_status(batch / "MNIST-dir0.1_FedAvg_g_1.h5", argv) == "complete"
    assert run_status(batch / "MNIST-dir0.1_FedAvg_g_1.h5", argv + ["-m", "DNN"]) == "stale"
    # Only how the finished series is summarised: the run is the same, so not stale.
    assert run_status(batch / "MNIST-dir0.1_FedAvg_g_1.h5", argv + ["--report_last_k", "3"]) == "complete"
    assert run_status(batch / "MNIST-dir0.1_FedAvg_g_3.h5", argv) == "incomplete"
    assert run_status(batch / "MNIST-dir0.1_FedAvg_g_7.h5", argv) == "missing"


def test_one_row_per_algorithm_when_goals_only_differ_by_dataset(tmp_path):
    # The paper driver runs MNIST with goal paper-DNN and CIFAR-10 with paper-CNN: still one row each.
    for algorithm in ("FedAvg", "FedLAG"):
        write_run(tmp_path, "MNIST-dir0.1", algorithm, 0, [0.5], goal="paper-DNN", config={"model": "DNN"})
        write_run(tmp_path, "Cifar10-dir0.1", algorithm, 0, [0.3], goal="paper-CNN")
    runs, _ = load_runs(find_runs([tmp_path]))
    lines = markdown_table(group_runs(runs)).splitlines()
    # the paper's order; each column names the model its runs differ in from the other's
    assert lines[0] == "| method | MNIST Dir(0.1) (-m DNN) | Cifar10 Dir(0.1) (-m CNN) |" and len(lines) == 4
    assert lines[3] == "| FedAvg | **50.00** | **30.00** |"
    assert models_note(group_runs(runs)) == "Models: CNN, DNN (-m in each label)."
    write_run(tmp_path, "MNIST-dir0.1", "FedAvg", 0, [0.6], goal="other")   # now a cell has two goals
    runs, _ = load_runs(find_runs([tmp_path]))
    labels = [line.split(" | ")[0][2:] for line in markdown_table(group_runs(runs)).splitlines()[2:]]
    # Rows split by goal also name the flags that differ between them (here the model).
    assert labels == ["FedAvg (other; -m CNN)", "FedLAG (paper-CNN; -m CNN)", "FedAvg (paper-CNN; -m CNN)",
                      "FedLAG (paper-DNN; -m DNN)", "FedAvg (paper-DNN; -m DNN)"]


def constant_curve(level: float):
    """A 3-point curve at ``level`` (fraction), one run, no spread."""
    return np.arange(3), np.full(3, level), np.zeros(3), np.ones(3)


def test_a_large_grid_becomes_one_panel_per_algorithm_with_the_references_in_each():
    bases = [f"Algo{i}" for i in range(plots.PANEL_LIMIT + 1)]
    curves = {"FedAvg": constant_curve(0.1), "FedLAG": constant_curve(0.2)}
    for i, base in enumerate(bases):
        curves[base] = constant_curve(0.3 + 0.05 * i)
        curves[base + "+LAG"] = constant_curve(0.31 + 0.05 * i)
    fig = plots.plot_accuracy_curves(curves, "t")
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == bases          # FedAvg and FedLAG get no panel of their own
    last = panels[-1]
    levels = [line.get_ydata()[0] for line in last.lines]
    assert levels == pytest.approx([10, 20, 100 * (0.3 + 0.05 * 8), 100 * (0.31 + 0.05 * 8)])  # refs, X, X+LAG
    assert [line.get_linestyle() for line in last.lines][2:] == ["-", "--"]   # X solid, X+LAG dashed
    assert last.get_ylim() == (0, 100)                           # one scale for every panel
    small = plots.plot_accuracy_curves({b: curves[b] for b in bases[:plots.PANEL_LIMIT]}, "t")
    assert len(small.axes) == 1                                  # up to the limit: one axes


def test_the_overview_keeps_the_algorithms_of_every_dataset_when_the_grid_is_large():
    wide = {f"A{i}": constant_curve(0.5) for i in range(5)}
    panels = {"MNIST": {**wide, "FedAvg": constant_curve(0.1)}, "Cifar10": {"FedAvg": constant_curve(0.1),
                                                                           "A0": constant_curve(0.2)}}
    assert report.overview_panels(panels, limit=6) == (panels, "")            # 6 algorithms: all drawn
    kept, note = report.overview_panels(panels, limit=4)
    assert {label: sorted(curves) for label, curves in kept.items()} == {"MNIST": ["A0", "FedAvg"],
                                                                          "Cifar10": ["A0", "FedAvg"]}
    assert note and report.overview_panels(panels, limit=1) == (     # still too many: none, and why
        {}, "6 algorithms, more than 1 for one figure, and 2 of them run on every dataset")


# ----- the statistics besides best and final (issue 16) ---------------------------------------------------
# One column (MNIST Dir(0.1)), one seed per row, k = 3 (the --report_last_k the new run recorded):
# FedAvg, written before the summary attribute existed (none, and no report_last_k in its config):
#   accuracy [0.2, 0.6, 0.5, 0.4]: best 0.6, final 0.4, last-3 mean (0.6 + 0.5 + 0.4) / 3 = 0.5;
#   11 clients at the final evaluation: mean 0.5, squared deviations 0.16 + 0.04 + 0.04 + 0.16 = 0.4,
#   std sqrt(0.4 / 11) = 0.190693; worst ceil(11 / 10) = 2 clients: (0.1 + 0.3) / 2 = 0.2.
# FedLAG, written as the training loop writes it now (summary attribute, --report_last_k 3):
#   accuracy [0.3, 0.7, 0.8, 0.6]: best 0.8, final 0.6, last-3 mean 0.7;
#   5 clients: mean 0.6, squared deviations 0.09 + 0.04 + 0.01 = 0.14, std sqrt(0.14 / 5) = 0.167332;
#   worst ceil(5 / 10) = 1 client: 0.3.
OLD_ACC, OLD_CLIENTS = [0.2, 0.6, 0.5, 0.4], [0.1, 0.3, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.7, 0.9]
NEW_ACC, NEW_CLIENTS = [0.3, 0.7, 0.8, 0.6], [0.6, 0.3, 0.8, 0.6, 0.7]


def write_run_with_clients(folder, algorithm, acc, final_clients, summary_k=None):
    """A run whose rs_client_acc ends with ``final_clients``; with ``summary_k``, also the summary attribute
    and the report_last_k a run of this version records."""
    earlier = np.full((len(acc) - 1, len(final_clients)), 0.5)
    arrays = {"rs_test_acc": np.asarray(acc), "rs_eval_round": np.arange(len(acc)),
              "rs_client_acc": np.vstack([earlier, final_clients])}
    config = {"dataset": "MNIST-dir0.1", "algorithm": algorithm, "goal": "g", "model": "CNN", "seed": 0}
    attrs = {"run": 0, "algorithm": algorithm, "dataset": "MNIST-dir0.1", "complete": True}
    if summary_k is not None:
        config["report_last_k"] = summary_k
        attrs["summary"] = summary_from_arrays(arrays, summary_k).as_attrs()
    write_results(result_path(folder, "MNIST-dir0.1", algorithm, "g", 0), arrays, {**attrs, "config": config})


def sections(markdown):
    """{heading: table lines} of report.py's tables."""
    parts = [p.split("\n\n") for p in markdown.split("## ")[1:]]
    return {p[0]: p[1].splitlines() for p in parts}


@pytest.fixture
def old_and_new(tmp_path):
    folder = tmp_path / "results"
    write_run_with_clients(folder, "FedAvg", OLD_ACC, OLD_CLIENTS)
    write_run_with_clients(folder, "FedLAG", NEW_ACC, NEW_CLIENTS, summary_k=3)
    return folder


def test_report_shows_every_statistic_alike_for_runs_with_and_without_the_summary(old_and_new, tmp_path):
    out = tmp_path / "rep"
    assert report.main([str(old_and_new), "-o", str(out), "--no-plots"]) == 0
    tables = sections((out / "table.md").read_text())
    # Means over clients: FedAvg's final clients average 5.5 / 11 = 0.5, and its earlier rows 0.5, so its last 3
    # evaluations 0.5; FedLAG's final clients 3.0 / 5 = 0.6, its last 3 evaluations (0.5 + 0.5 + 0.6) / 3.
    expected = {  # heading: (FedLAG row, FedAvg row); bold = the best of the column
        "Best accuracy (%): max over evaluations": ("**80.00**", "60.00"),
        "Final accuracy (%): last evaluation": ("**60.00**", "40.00"),
        "Final accuracy, mean over clients (%): each client's accuracy at the last evaluation, unweighted":
            ("**60.00**", "50.00"),
        "Mean accuracy of the last 3 evaluations (%)": ("**70.00**", "50.00"),
        "Mean over clients of the last 3 evaluations (%): each client's accuracy, unweighted": ("**53.33**", "50.00"),
        "Worst 10% of clients at the final evaluation (%): mean accuracy of the ceil(n/10) lowest clients":
            ("**30.00**", "20.00"),
        "Std over clients of the final accuracy (percentage points; lower = more even)": ("**16.73**", "19.07"),
    }
    assert list(tables) == list(expected)
    for heading, (lag, avg) in expected.items():
        assert tables[heading][2:] == [f"| FedLAG | {lag} |", f"| FedAvg | {avg} |"], heading
    rows = list(csv.reader(open(out / "table.csv")))
    assert rows[0] == ["method", "MNIST Dir(0.1) best", "MNIST Dir(0.1) final", "MNIST Dir(0.1) final client mean",
                       "MNIST Dir(0.1) last-3 mean", "MNIST Dir(0.1) last-3 client mean",
                       "MNIST Dir(0.1) final worst-10%", "MNIST Dir(0.1) final client std"]
    assert rows[2] == ["FedAvg", "60.00", "40.00", "50.00", "50.00", "50.00", "20.00", "19.07"]
    summary = {r["algorithm"]: r for r in csv.DictReader(open(out / "summary.csv"))}
    avg = summary["FedAvg"]
    assert avg["last_k"] == "3" and float(avg["last_k_mean"]) == pytest.approx(0.5)
    assert float(avg["worst10_mean"]) == pytest.approx(0.2)
    assert float(avg["client_std_mean"]) == pytest.approx(0.190693, abs=1e-6)
    assert float(summary["FedLAG"]["client_std_mean"]) == pytest.approx(0.167332, abs=1e-6)
    # The new run's stored summary is what the report computed from its arrays.
    runs, _ = load_runs(find_runs([old_and_new]))
    new = next(r for r in runs if r.algorithm == "FedLAG")
    assert read_results(new.path)[1]["summary"] == new.summary(3).as_attrs()


def test_last_k_can_be_chosen_and_names_itself(old_and_new, tmp_path):
    out = tmp_path / "rep"
    assert report.main([str(old_and_new), "-o", str(out), "--no-plots", "--last-k", "2"]) == 0
    table = sections((out / "table.md").read_text())["Mean accuracy of the last 2 evaluations (%)"]
    assert table[2:] == ["| FedLAG | **70.00** |", "| FedAvg | 45.00 |"]   # (0.8 + 0.6) / 2, (0.5 + 0.4) / 2
    with pytest.raises(SystemExit):
        report.main([str(old_and_new), "-o", str(out), "--last-k", "0"])


def test_the_report_k_is_the_one_the_runs_agree_on():
    def runs(*values):
        return [SimpleNamespace(algorithm="FedAvg", config={} if v is None else {"report_last_k": v})
                for v in values]
    assert recorded_last_k(runs(None, 3, 3)) == 3        # runs from before the flag have no preference
    assert recorded_last_k(runs(3, 5)) == 10              # disagreeing: the default, named in the caption
    assert recorded_last_k(runs(None)) == 10
    assert recorded_last_k(runs(3), asked=7) == 7
    # not a setting: seeds differing in it are one cell
    assert run_settings(runs(3)[0]) == run_settings(runs(5)[0])


def test_a_statistic_the_runs_cannot_give_is_na_and_the_note_says_why(batch):
    runs, _ = load_runs(find_runs([batch]))   # these files hold no rs_client_acc, like PFLlib's
    tables = report.tables_markdown(group_runs(runs))
    worst = sections(tables)["Worst 10% of clients at the final evaluation (%): mean accuracy of the ceil(n/10) "
                             "lowest clients"]
    assert worst[2:] == ["| FedLAG | n/a | n/a |", "| FedAvg | n/a | n/a |"]   # never bold
    assert "n/a: a run of the cell recorded no per-client accuracies" in tables
