"""The report of -dlg runs: a table of the mean DLG PSNR beside the accuracies, only where runs recorded it, and
a figure of the PSNR per attacked round; both checked against the .h5 values they show."""
import numpy as np
import pytest

import report
from reporting import plots
from reporting.grouping import group_runs
from reporting.runs import find_runs, load_runs
from reporting.tables import markdown_table, shown_statistics
from utils.result_utils import result_path, write_results

# Two seeds of FedAvg with -dlg (attacked at rounds 0, 2, 4) and one of FedLAG, whose round 2 attacked nothing.
PSNR = {("FedAvg", 0): [30.0, 25.0, 20.0], ("FedAvg", 1): [32.0, 27.0, 24.0], ("FedLAG", 0): [18.0, np.nan, 14.0]}


def write_run(folder, algorithm, run, dlg=True):
    arrays = {"rs_test_acc": np.array([0.1, 0.5, 0.6, 0.7, 0.8]), "rs_eval_round": np.arange(5),
              "rs_train_loss": np.ones(5)}
    config = {"dataset": "MNIST", "algorithm": algorithm, "goal": "g", "model": "CNN", "seed": run,
              "dlg_eval": dlg, "dlg_gap": 2, "batch_num_per_client": 1}
    if dlg:
        arrays.update(rs_dlg_round=np.array([0, 2, 4]), rs_dlg_psnr=np.array(PSNR[(algorithm, run)]),
                      rs_dlg_ssim=np.array([0.9, 0.8, 0.7]))
    write_results(result_path(folder, "MNIST", algorithm, "g", run), arrays,
                  {"config": config, "run": run, "algorithm": algorithm, "dataset": "MNIST", "complete": True,
                   "rounds_done": 5})


@pytest.fixture
def dlg_batch(tmp_path):
    folder = tmp_path / "results"
    for algorithm, run in PSNR:
        write_run(folder, algorithm, run)
    return folder


def test_the_table_holds_the_mean_psnr_only_when_runs_recorded_it(dlg_batch, tmp_path):
    groups = group_runs(load_runs(find_runs([dlg_batch]))[0])
    assert "dlg_psnr" in [s.name for s in shown_statistics(groups)]
    lines = markdown_table(groups, "dlg_psnr").splitlines()
    # FedAvg: the seeds' means over rounds are 25 and 27.667 -> 26.33 ± 1.33; FedLAG: (18 + 14) / 2, the
    # round that attacked nothing left out. Lower is better (less revealed): FedLAG in bold.
    assert lines[2:] == ["| FedLAG | **16.00** |", "| FedAvg | 26.33 ± 1.33 |"]
    plain = tmp_path / "plain"
    write_run(plain, "FedAvg", 0, dlg=False)
    assert "dlg_psnr" not in [s.name for s in shown_statistics(group_runs(load_runs(find_runs([plain]))[0]))]


def test_the_report_draws_the_psnr_per_attacked_round_as_the_files_hold_it(dlg_batch, tmp_path):
    out = tmp_path / "report"
    assert report.main([str(dlg_batch), "-o", str(out)]) == 0
    tables = (out / "table.md").read_text()
    assert "## DLG mean PSNR (dB)" in tables and "| FedAvg | 26.33 ± 1.33 |" in tables
    assert "![dlg_MNIST](dlg_MNIST.png)" in (out / "report.md").read_text()
    groups = {g.algorithm: g for g in group_runs(load_runs(find_runs([dlg_batch]))[0])}
    fig = plots.plot_dlg_psnr({name: g.dlg_curve() for name, g in groups.items()}, "t")
    lines = {line.get_label().split(" (")[0]: line for line in fig.axes[0].lines}
    assert lines["FedAvg"].get_xdata().tolist() == [0, 2, 4]
    assert np.allclose(lines["FedAvg"].get_ydata(), np.mean([PSNR[("FedAvg", 0)], PSNR[("FedAvg", 1)]], axis=0))
    assert np.allclose(lines["FedLAG"].get_ydata(), PSNR[("FedLAG", 0)], equal_nan=True)
    assert len(fig.axes[0].collections) == 1  # the spread of FedAvg's two seeds; FedLAG has one
    assert "PSNR" in fig.axes[0].get_ylabel()


def test_a_report_without_dlg_runs_draws_no_dlg_figure(tmp_path):
    folder = tmp_path / "plain"
    write_run(folder, "FedAvg", 0, dlg=False)
    out = tmp_path / "report"
    assert report.main([str(folder), "-o", str(out)]) == 0
    assert not list(out.glob("dlg_*.png")) and "DLG" not in (out / "table.md").read_text()
