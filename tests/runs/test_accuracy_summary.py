"""A run's summary (best, final, last-k mean, the clients' spread at the final evaluation): hand-computed
values, the worst-10% rounding rule, the .h5's summary attribute and the console lines."""
import math
import re

import numpy as np
import pytest

import main
from helpers import cli, server_for, train, results_file
from utils.accuracy_summary import final_client_accuracy, summarize_accuracy, summary_from_arrays, worst_count
from utils.result_utils import read_results

# Five clients: mean 0.5, deviations (.4, -.4, 0, .2, -.2), population variance 0.4 / 5 = 0.08.
FIVE_CLIENTS = [0.9, 0.1, 0.5, 0.7, 0.3]


def test_best_final_and_last_k_mean_of_a_series():
    s = summarize_accuracy([0.1, 0.5, 0.4], None, last_k=2)
    assert (s.best, s.final) == (0.5, 0.4)
    assert s.last_k_mean == pytest.approx(0.45) and (s.last_k, s.last_k_count) == (2, 2)
    assert summarize_accuracy([0.1, 0.5, 0.4], None, last_k=1).last_k_mean == 0.4


def test_fewer_evaluations_than_k_average_all_of_them_and_say_how_many():
    s = summarize_accuracy([0.1, 0.5, 0.4], None, last_k=10)
    assert s.last_k_mean == pytest.approx(1.0 / 3) and (s.last_k, s.last_k_count) == (10, 3)


@pytest.mark.parametrize("clients,worst", [(0, 0), (1, 1), (5, 1), (10, 1), (11, 2), (20, 2), (21, 3), (30, 3),
                                           (100, 10), (101, 11)])
def test_worst_ten_percent_is_ceil_of_a_tenth_and_at_least_one(clients, worst):
    # 30 clients: ceil(30 / 10) = 3, where float arithmetic gives math.ceil(0.1 * 30) = 4.
    assert worst_count(clients) == worst


def test_client_spread_at_the_final_evaluation():
    s = summarize_accuracy([0.2, 0.5], FIVE_CLIENTS)
    assert s.clients == 5
    assert s.final_client_std == pytest.approx(math.sqrt(0.08))
    assert s.final_worst10_mean == pytest.approx(0.1)          # ceil(5 / 10) = 1: the lowest client
    assert s.final_client_mean == pytest.approx(sum(FIVE_CLIENTS) / 5)  # every client alike, not by samples
    eleven = FIVE_CLIENTS + [0.6, 0.6, 0.6, 0.2, 0.8, 0.8]
    assert summarize_accuracy([0.5], eleven).final_worst10_mean == pytest.approx((0.1 + 0.2) / 2)  # 2 of 11


def test_nothing_recorded_gives_nan_not_an_error():
    s = summarize_accuracy([], None)
    assert all(math.isnan(v) for v in (s.best, s.final, s.last_k_mean, s.final_client_std, s.final_worst10_mean,
                                       s.final_client_mean))
    assert (s.last_k_count, s.clients) == (0, 0)
    s = summarize_accuracy([0.3], [])
    assert s.best == 0.3 and math.isnan(s.final_worst10_mean) and s.clients == 0
    with pytest.raises(ValueError, match="last_k must be >= 1"):
        summarize_accuracy([0.3], None, last_k=0)


def test_final_client_accuracy_is_the_last_row_that_matches_the_evaluations():
    history = {"rs_test_acc": [0.1, 0.2], "rs_client_acc": [np.array([0.0, 1.0]), np.array([0.25, 0.75])]}
    assert final_client_accuracy(history).tolist() == [0.25, 0.75]             # a live history (list of rows)
    table = {"rs_test_acc": np.array([0.1, 0.2]), "rs_client_acc": np.array([[0.0, 1.0], [0.25, 0.75]])}
    assert final_client_accuracy(table).tolist() == [0.25, 0.75]               # the same, read from an .h5
    assert final_client_accuracy({"rs_test_acc": [0.1]}) is None               # PFLlib's files
    assert final_client_accuracy({"rs_test_acc": [0.1], "rs_client_acc": np.zeros((0, 0))}) is None  # Flower
    assert final_client_accuracy({"rs_test_acc": [0.1, 0.2, 0.3], "rs_client_acc": table["rs_client_acc"]}) is None
    assert final_client_accuracy({"rs_test_acc": [0.1, 0.2],
                                  "rs_client_acc": [np.array([0.5]), np.array([0.5, 0.5])]}) is None  # ragged


def test_the_h5_summary_is_the_summary_of_its_own_arrays(data_dir, tmp_path):
    # -lr 0.01: accuracy still climbing, so best, final, last-2 mean and the clients all differ.
    server = server_for(data_dir, tmp_path, "-gr", "3", "-lr", "0.01", "--report_last_k", "2")
    train(server)
    arrays, attrs = read_results(results_file(server))
    summary = attrs["summary"]
    acc, final_clients = arrays["rs_test_acc"], arrays["rs_client_acc"][-1]
    assert summary == summary_from_arrays(arrays, 2).as_attrs()
    assert summary["best"] == acc.max() and summary["final"] == acc[-1]
    assert summary["last_k_mean"] != summary["final"] and len(set(final_clients)) > 1  # not a trivial check
    assert summary["last_k_mean"] == pytest.approx((acc[-2] + acc[-1]) / 2) and summary["last_k"] == 2
    assert summary["clients"] == 6 and summary["final_worst10_mean"] == final_clients.min()  # ceil(6/10) = 1
    assert summary["final_client_std"] == pytest.approx(np.std(final_clients))
    assert summary["final_client_mean"] == pytest.approx(np.mean(final_clients))
    assert summary["final_client_mean"] != pytest.approx(summary["final"])  # clients of unequal test sizes


LINE = re.compile(r"^best accuracy (\S+) \| final (\S+) \| last-(\d+) mean (\S+) \| "
                  r"final, mean over (\d+) clients (\S+) \| .* results in (\S+)$")


def test_console_lines_show_best_final_and_last_k_per_run_and_over_runs(data_dir, tmp_path, capsys):
    results = tmp_path / "r"
    assert main.main(cli(data_dir, results, "-gr", "3", "-lr", "0.01", "-t", "2", "--report_last_k", "2")) == 0
    out = capsys.readouterr().out
    per_run = [LINE.match(line) for line in out.splitlines() if line.startswith("best accuracy ")]
    per_run = [m for m in per_run if m]
    assert len(per_run) == 2
    values = []
    for run, match in enumerate(per_run):
        arrays = read_results(results / f"Toy_FedAvg_test_{run}.h5")[0]
        acc, clients = arrays["rs_test_acc"], arrays["rs_client_acc"][-1]
        best, final, k, last = float(match[1]), float(match[2]), int(match[3]), float(match[4])
        assert k == 2 and last == pytest.approx(np.mean(acc[-2:]), abs=5e-5)
        assert best == pytest.approx(acc.max(), abs=5e-5) and final == pytest.approx(acc[-1], abs=5e-5)
        assert int(match[5]) == 6 and float(match[6]) == pytest.approx(np.mean(clients), abs=5e-5)
        values.append((acc.max(), acc[-1], np.mean(acc[-2:]), np.mean(clients)))
    best, final, last, client_mean = np.array(values).T
    expected = (f"best accuracy over 2 runs: {np.mean(best):.4f} +- {np.std(best):.4f} | "
                f"final {np.mean(final):.4f} +- {np.std(final):.4f} | "
                f"last-2 mean {np.mean(last):.4f} +- {np.std(last):.4f} | "
                f"final, mean over clients {np.mean(client_mean):.4f} +- {np.std(client_mean):.4f}")
    assert expected in out.splitlines()
