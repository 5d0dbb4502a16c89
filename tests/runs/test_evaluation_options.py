"""Evaluation beyond PFLlib's: a validation split (--val_ratio) for choosing the round, evaluation after
local training (--eval_after_training), and the run's series as a CSV and as TensorBoard events."""
import csv
import sys

import numpy as np
import pytest
import torch

import main
from helpers import cli, in_use, server_for, train, results_file
from flcore.executors.client_worker import ClientWorker, worker_arguments
from reporting.grouping import group_runs
from reporting.runs import find_runs, load_runs
from reporting.tables import shown_statistics
from report import tables_markdown
from utils.accuracy_summary import summarize_accuracy
from utils.client_data import ClientData, VALIDATION_STREAM
from utils.result_utils import read_results
from utils.run_table import csv_path
from utils.tensorboard_log import TensorBoardError, tensorboard_folder


def trained(data_dir, tmp_path, *flags):
    server = server_for(data_dir, tmp_path, *flags)
    train(server)
    return server, *read_results(results_file(server))


# ----- --val_ratio ------------------------------------------------------------------------------------

def test_split_off_holds_out_a_fraction_keeping_file_order_and_every_sample_once():
    data = ClientData(torch.arange(20.0).reshape(10, 2), torch.arange(10))
    rest, held = data.split_off(0.3, seed=(VALIDATION_STREAM, 4))
    assert (len(rest), len(held)) == (7, 3)
    ids = sorted(rest.y.tolist() + held.y.tolist())
    assert ids == list(range(10))                                       # nothing lost, nothing twice
    assert rest.y.tolist() == sorted(rest.y.tolist()) and held.y.tolist() == sorted(held.y.tolist())
    assert torch.equal(rest.x[:, 0], 2.0 * rest.y)                      # x stays with its y
    again, _ = data.split_off(0.3, seed=(VALIDATION_STREAM, 4))
    other, _ = data.split_off(0.3, seed=(VALIDATION_STREAM, 5))
    assert torch.equal(again.y, rest.y) and not torch.equal(other.y, rest.y)
    assert [len(p) for p in ClientData(torch.zeros(2, 1), torch.arange(2)).split_off(0.01, seed=(1,))] == [1, 1]


def test_validation_samples_leave_training_and_are_the_same_for_every_seed(data_dir, tmp_path):
    plain = server_for(data_dir, tmp_path / "a")
    seeds = [server_for(data_dir, tmp_path / f"s{s}", "--val_ratio", "0.25", "--seed", str(s)) for s in (0, 1)]
    for whole, c0, c1 in zip(plain.clients, *(s.clients for s in seeds)):
        assert c0.train_samples + len(c0.val_data) == whole.train_samples == c0.train_samples + len(c1.val_data)
        assert len(c0.val_data) == round(0.25 * whole.train_samples)
        assert torch.equal(c0.val_data.x, c1.val_data.x) and torch.equal(c0.train_data.y, c1.train_data.y)
        rows = {tuple(r) for r in whole.train_data.x.flatten(1).tolist()}
        held = {tuple(r) for r in c0.val_data.x.flatten(1).tolist()}
        kept = {tuple(r) for r in c0.train_data.x.flatten(1).tolist()}
        assert held <= rows and kept <= rows and not held & kept
    assert plain.clients[0].val_data is None


def test_validation_accuracy_is_recorded_and_picks_the_reported_round(data_dir, tmp_path):
    server, arrays, attrs = trained(data_dir, tmp_path, "--val_ratio", "0.3", "-gr", "3")
    assert len(arrays["rs_val_acc"]) == len(arrays["rs_test_acc"]) == 4
    # The last value by hand: correct predictions over all clients' validation samples.
    correct = total = 0
    for c in server.clients:
        c.check_out()
        c.model.eval()
        with torch.no_grad():
            correct += int((c.model(c.val_data.x).argmax(1) == c.val_data.y).sum())
        total += len(c.val_data)
    assert arrays["rs_val_acc"][-1] == pytest.approx(correct / total)
    best = int(np.argmax(arrays["rs_val_acc"]))
    assert attrs["summary"]["test_at_best_val"] == arrays["rs_test_acc"][best]


def test_test_accuracy_at_the_first_best_validation_evaluation():
    s = summarize_accuracy([0.5, 0.7, 0.6, 0.9], None, validation=[0.2, 0.8, 0.8, 0.1])
    assert s.test_at_best_val == 0.7 and s.best == 0.9
    assert np.isnan(summarize_accuracy([0.5], None).test_at_best_val)
    assert np.isnan(summarize_accuracy([0.5, 0.6], None, validation=[0.1]).test_at_best_val)  # not aligned


def test_workers_train_on_the_same_reduced_split(data_dir, tmp_path):
    """A worker (Ray's or the process pool's) reads each client's data as the server split it."""
    server = server_for(data_dir, tmp_path, "--val_ratio", "0.25")
    worker = ClientWorker(*worker_arguments(server))
    for client in server.clients:
        shipped = worker._with_data(client.detached())
        for split in ("train_data", "test_data", "val_data"):
            theirs, ours = getattr(shipped, split), getattr(client, split)
            assert torch.equal(theirs.x, ours.x) and torch.equal(theirs.y, ours.y)


@pytest.mark.parametrize("value", ["-0.1", "1", "nan"])
def test_a_validation_ratio_outside_zero_to_one_is_refused(data_dir, tmp_path, capsys, value):
    with pytest.raises(SystemExit) as exit_:
        main.main(cli(data_dir, tmp_path, "--val_ratio", value))
    assert exit_.value.code == 2 and "--val_ratio must be in [0, 1)" in capsys.readouterr().err


# ----- --eval_after_training --------------------------------------------------------------------------

def test_evaluating_after_training_changes_no_training_result(data_dir, tmp_path):
    flags = ("-algo", "FedLAG", "-jr", "0.5", "-gr", "3")
    _, plain, _ = trained(data_dir, tmp_path / "plain", *flags)
    _, after, _ = trained(data_dir, tmp_path / "after", *flags, "--eval_after_training")
    for name in plain:
        if name != "rs_round_time":
            np.testing.assert_array_equal(plain[name], after[name], err_msg=name)
    assert list(after["rs_after_clients"]) == [3] * 4   # -jr 0.5 of 6 clients trained each round
    assert "rs_after_test_acc" not in plain


def test_local_clients_after_training_are_what_the_next_round_evaluates(data_dir, tmp_path):
    """Local's broadcast changes nothing, so with every client training the accuracy after round r's
    training is the accuracy evaluated at the start of round r + 1."""
    _, arrays, attrs = trained(data_dir, tmp_path, "-algo", "Local", "-gr", "3", "--eval_after_training")
    np.testing.assert_array_equal(arrays["rs_after_test_acc"][:-1], arrays["rs_test_acc"][1:])
    assert attrs["summary"]["after_final"] == arrays["rs_after_test_acc"][-1]


def test_reports_show_the_optional_statistics_only_for_runs_that_have_them(data_dir, tmp_path):
    trained(data_dir, tmp_path, "-go", "plain")
    groups = group_runs(load_runs(find_runs([tmp_path]))[0])
    assert len(groups) == 1 and [s.name for s in shown_statistics(groups)][-1] == "client_std"
    trained(data_dir, tmp_path, "-go", "val", "--val_ratio", "0.2", "--eval_after_training")
    groups = group_runs(load_runs(find_runs([tmp_path]))[0])
    assert [s.name for s in shown_statistics(groups)][-2:] == ["at_best_val", "after_final"]
    text = tables_markdown(groups)
    assert "Test accuracy at the best validation evaluation" in text and "after local training" in text


# ----- CSV and TensorBoard ----------------------------------------------------------------------------

def test_the_csv_beside_the_h5_holds_the_same_series_by_round(data_dir, tmp_path):
    server, arrays, attrs = trained(data_dir, tmp_path, "-gr", "4", "-eg", "2", "--val_ratio", "0.2")
    lines = csv_path(results_file(server)).read_text().splitlines()
    comments = [line for line in lines if line.startswith("#")]
    assert comments[0].startswith("# config: {") and '"val_ratio": 0.2' in comments[0]
    assert comments[1] == f"# git_revision: {attrs['git_revision']}" and attrs["git_revision"]
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    assert [int(r["round"]) for r in rows] == [0, 1, 2, 3, 4]
    evaluated = [r for r in rows if r["rs_test_acc"]]
    assert [int(r["round"]) for r in evaluated] == list(arrays["rs_eval_round"]) == [0, 2, 4]
    for name in ("rs_test_acc", "rs_train_loss", "rs_val_acc"):
        assert [float(r[name]) for r in evaluated] == list(arrays[name])  # repr round-trips exactly
    assert [float(r["rs_round_time"]) for r in rows] == list(arrays["rs_round_time"])


def test_tensorboard_events_hold_each_round_of_the_series(data_dir, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    server, arrays, _ = trained(data_dir, tmp_path, "-gr", "3", "--tensorboard")
    events = EventAccumulator(str(tensorboard_folder(results_file(server))))
    events.Reload()
    assert {"rs_test_acc", "rs_train_loss", "rs_round_time"} <= set(events.Tags()["scalars"])
    acc = events.Scalars("rs_test_acc")
    assert [e.step for e in acc] == [0, 1, 2, 3]
    np.testing.assert_allclose([e.value for e in acc], arrays["rs_test_acc"], rtol=1e-6)  # stored as float32


def test_tensorboard_without_its_package_is_a_clear_error_before_any_round(data_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    server = server_for(data_dir, tmp_path, "--tensorboard")
    with pytest.raises(TensorBoardError, match="pip install tensorboard"):
        train(server)
    assert server.history["rs_test_acc"] == []


# ----- --eval_clients ---------------------------------------------------------------------------------

def test_a_sample_of_clients_is_evaluated_the_same_at_every_evaluation_and_training_is_unchanged(data_dir, tmp_path):
    sampled, arrays, _ = trained(data_dir, tmp_path / "sampled", "-algo", "FedAvg", "--eval_clients", "3")
    everyone, all_arrays, _ = trained(data_dir, tmp_path / "all", "-algo", "FedAvg")
    ids = arrays["rs_eval_clients"].tolist()
    assert len(ids) == 3 == len(set(ids)) and ids == sorted(ids) and set(ids) <= set(range(6))
    assert [c.id for c in sampled.evaluation_clients()] == ids          # the same clients at every evaluation
    assert "rs_eval_clients" not in all_arrays and len(everyone.evaluation_clients()) == 6
    assert arrays["rs_client_acc"].shape == (3, 3) and all_arrays["rs_client_acc"].shape == (3, 6)
    for name, tensor in everyone.global_model.state_dict().items():   # evaluation draws nothing training draws
        assert torch.equal(sampled.global_model.state_dict()[name], tensor)
    np.testing.assert_array_equal(arrays["rs_train_loss"] != all_arrays["rs_train_loss"], [True] * 3)


def test_the_sampled_accuracy_is_that_of_the_sampled_clients_alone(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedAvg", "--eval_clients", "2", "--seed", "3")
    chosen = server.evaluation_clients()
    summary = server.evaluate()
    stats = [in_use(c).test_metrics() for c in chosen]
    assert summary.accuracy == sum(s.correct for s in stats) / sum(s.num_samples for s in stats)
    assert [c.id for c in chosen] == [c.id for c in server_for(data_dir, tmp_path / "again", "-algo", "FedAvg",
                                                               "--eval_clients", "2", "--seed", "3").evaluation_clients()]
    more = server_for(data_dir, tmp_path / "more", "-algo", "FedAvg", "--eval_clients", "6")
    assert more.evaluation_clients() is more.clients                    # K >= -nc: every client, nothing recorded
    assert "rs_eval_clients" not in more.result_arrays()
