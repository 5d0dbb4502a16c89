"""The round loop: who receives what, when evaluation happens, sampling, drop-out, divergence."""
import copy

import numpy as np
import pytest
import torch

from flcore.aggregation import named_tensors
from utils.errors import RunError
from utils.result_utils import read_results
from helpers import server_for, state_equal, upload_current_state, train, results_file


def test_send_overwrites_every_client_selected_or_not(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-jr", "0.5")
    server.train_clients(server.clients)  # make every client differ from the global model
    server.selected_clients = server.select_clients()
    server.send_models()
    global_state = named_tensors(server.global_model)
    for client in server.clients:
        assert state_equal(client.module_tensors(), global_state)


def test_evaluation_runs_before_local_training_and_is_sample_weighted(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-gr", "0")
    initial = copy.deepcopy(server.global_model).eval()
    correct = total = 0
    with torch.no_grad():
        for client in server.clients:
            pred = initial(client.test_data.x).argmax(1)
            correct += int((pred == client.test_data.y).sum())
            total += len(client.test_data.y)
    train(server)
    assert server.rs_test_acc == [correct / total]
    assert len(server.rs_test_auc) == 1 and 0 <= server.rs_test_auc[0] <= 1


def test_join_ratio_and_random_join_ratio_counts(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-jr", "0.5")
    assert len(server.select_clients()) == 3
    server = server_for(data_dir, tmp_path, "-jr", "0.5", "-rjr", "True")
    counts = {len(server.select_clients()) for _ in range(40)}
    assert counts <= {3, 4, 5, 6} and len(counts) > 1


def test_client_drop_rate_uploads_a_subset_of_the_trained(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-cdr", "0.5")
    server.selected_clients = server.select_clients()
    upload_current_state(server)
    server.receive_models()
    assert len(server.uploads) == 3
    assert set(server.uploader_ids()) <= {c.id for c in server.selected_clients}
    assert np.isclose(sum(server.upload_weights), 1.0)


def test_local_never_exchanges_parameters(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "Local", "-jr", "0.5", "-gr", "1")
    before = {c.id: copy.deepcopy(c.module_tensors()) for c in server.clients}
    selected = []
    original = server.select_clients
    server.select_clients = lambda: selected.append(original()) or selected[-1]
    train(server)
    trained = {c.id for round_clients in selected for c in round_clients}
    for client in server.clients:
        unchanged = state_equal(client.module_tensors(), before[client.id])
        assert unchanged == (client.id not in trained)
    assert not state_equal(server.clients[0].module_tensors(), server.clients[1].module_tensors())


def test_diverging_run_names_round_and_client_and_keeps_results(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-lr", "1e30", "-gr", "3")
    with pytest.raises(RunError, match=r"round 0: client \d+ reached a non-finite loss .* lower -lr"):
        train(server)
    arrays, attrs = read_results(results_file(server))
    assert len(arrays["rs_test_acc"]) == 1  # the evaluation of round 0 was kept
    assert not attrs["complete"]


def test_auto_break_stops_when_accuracy_stalls(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-gr", "50", "-ab", "True", "-tc", "2", "-lr", "1e-9")
    train(server)
    assert len(server.rs_test_acc) < 51


def test_new_clients_are_fine_tuned_and_reported_separately(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-nc", "4", "-nnc", "2", "-ften", "1", "-gr", "1")
    train(server)
    arrays, attrs = read_results(results_file(server))
    assert attrs["complete"] and attrs["rounds_done"] == 2
    assert len(arrays["rs_test_acc"]) == 2 and len(arrays["rs_new_test_acc"]) == 1
    assert arrays["rs_new_client_acc"].shape == (1, 2)
    assert [c.id for c in server.new_clients] == [4, 5]
