"""LG-FedAvg: the head is averaged and broadcast, the base (local representation) stays with each client."""
import copy

import numpy as np
import torch

from flcore.aggregation import named_tensors
from utils.result_utils import read_results
from helpers import assert_lag_composes, perturb_all_clients, play_round, server_for, state_equal, uploads_are, train, results_file


def test_head_is_averaged_and_every_base_stays_personal(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "LG-FedAvg", "-jr", "0.5")
    initial_base = copy.deepcopy(named_tensors(server.global_model.base))
    play_round(server)
    by_id = {c.id: c for c in server.clients}
    assert uploads_are(server, lambda c: c.model.head)
    total = sum(by_id[i].train_samples for i in server.uploader_ids())
    for name, value in server.global_model.head.named_parameters():
        expected = sum(dict(by_id[i].model.head.named_parameters())[name] * (by_id[i].train_samples / total)
                       for i in server.uploader_ids())
        assert torch.allclose(value, expected, atol=1e-6), name
    assert state_equal(named_tensors(server.global_model.base), initial_base)
    trained = [by_id[i] for i in server.uploader_ids()]
    assert not state_equal(named_tensors(trained[0].model.base), named_tensors(trained[1].model.base))

    perturb_all_clients(server)
    bases = {c.id: copy.deepcopy(named_tensors(c.model.base)) for c in server.clients}
    server.send_models()
    for client in server.clients:
        assert state_equal(named_tensors(client.model.head), named_tensors(server.global_model.head))
        assert state_equal(named_tensors(client.model.base), bases[client.id]), f"client {client.id} lost its base"


def test_lg_fedavg_lag_ranks_only_head_tensors_and_keeps_bases(data_dir, tmp_path):
    # The head has two tensors (weight, bias): K = 1 keeps one personal and still shares the other.
    server = server_for(data_dir, tmp_path, "-algo", "LG-FedAvg+LAG", "-jr", "0.5", "--lag_top_k", "3")  # its 2 base tensors count
    personal = assert_lag_composes(server, k=1)
    assert {n for layer in server.lag_layers for n in layer.tensors} == {"head.weight", "head.bias"}
    assert len(personal) == 1 and personal <= {"head.weight", "head.bias"}


def test_end_to_end_run_records_finite_results(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "LG-FedAvg", "-gr", "1")
    train(server)
    arrays, _ = read_results(results_file(server))
    assert arrays["rs_test_acc"].shape == (2,) and np.all(np.isfinite(arrays["rs_train_loss"]))
    assert arrays["rs_test_acc"][-1] > arrays["rs_test_acc"][0]
