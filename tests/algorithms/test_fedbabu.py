"""FedBABU: the head is frozen at its shared initial value during training; fine-tuning trains it."""
import copy

import numpy as np
import pytest
import torch

from flcore.aggregation import named_tensors
from utils.errors import ConfigError
from utils.result_utils import read_results
from helpers import assert_lag_composes, in_use, play_round, server_for, state_equal, uploads_are, train, results_file


def test_head_never_changes_during_rounds_and_fine_tuning_trains_head_and_base(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedBABU", "-jr", "0.5", "-fte", "1")
    initial = copy.deepcopy(named_tensors(server.global_model))
    initial_head = {n[len("head."):]: t for n, t in initial.items() if n.startswith("head.")}
    for _ in range(2):
        play_round(server)
    assert uploads_are(server, lambda c: in_use(c).model.base)
    for client in server.clients:
        client.check_out()
        assert state_equal(named_tensors(client.model.head), initial_head), f"client {client.id} head moved"
        assert not any(p.requires_grad for p in client.model.head.parameters())
    assert not state_equal(named_tensors(server.global_model), initial, [n for n in initial if n.startswith("base.")])

    server.finish()
    heads = [named_tensors(in_use(c).model.head) for c in server.clients]
    assert all(not state_equal(h, initial_head) for h in heads), "fine-tuning left a head at its initial value"
    assert not state_equal(heads[0], heads[1])
    assert all(not state_equal(named_tensors(c.model.base), named_tensors(server.global_model.base))
               for c in server.clients)
    assert not any(p.requires_grad for c in server.clients for p in c.model.head.parameters())
    assert len(server.history["rs_finetune_test_acc"]) == 1 and server.rs_test_acc == []


def test_fine_tuning_starts_from_the_final_global_body(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedBABU", "-jr", "0.5", "-fte", "0")
    play_round(server)
    trained = [c for c in server.clients if c.id in server.uploader_ids()]
    assert not state_equal(named_tensors(in_use(trained[0]).model.base), named_tensors(server.global_model.base))
    server.finish()  # zero epochs: what is evaluated is exactly what each client received
    for client in server.clients:
        assert state_equal(named_tensors(in_use(client).model.base), named_tensors(server.global_model.base))


def test_negative_fine_tuning_epochs_are_refused(data_dir, tmp_path):
    with pytest.raises(ConfigError, match="-fte"):
        server_for(data_dir, tmp_path, "-algo", "FedBABU", "-fte", "-1")


def test_fedbabu_lag_personalises_body_tensors_and_leaves_the_frozen_head(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedBABU+LAG", "-m", "CNN", "-jr", "0.5", "--lag_top_k", "2")
    head = copy.deepcopy(named_tensors(server.global_model.head))
    personal = assert_lag_composes(server, k=2, private=lambda c: {})
    assert all(name.startswith("base.") for name in personal)
    assert not any(n.startswith("head.") for layer in server.lag_layers for n in layer.tensors)
    # The broadcast never touches the head (perturb_all_clients moved it, training did not).
    client = server.clients[0]
    assert torch.allclose(client.model.head.weight, head["weight"] + 0.01 * (client.id + 1))


def test_end_to_end_run_saves_the_fine_tuned_evaluation_apart(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedBABU", "-gr", "1", "-fte", "2")
    train(server)
    arrays, _ = read_results(results_file(server))
    assert arrays["rs_test_acc"].shape == (2,) and arrays["rs_finetune_test_acc"].shape == (1,)
    assert np.all(np.isfinite(arrays["rs_finetune_train_loss"])) and np.all(np.isfinite(arrays["rs_train_loss"]))
    assert arrays["rs_finetune_client_acc"].shape == (1, 6)
    assert arrays["rs_finetune_test_acc"][0] > arrays["rs_test_acc"][0]
