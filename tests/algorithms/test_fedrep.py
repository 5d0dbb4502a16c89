"""FedRep: head epochs with the base frozen, then base epochs with the head frozen; only the base travels."""
import copy

import numpy as np
import pytest
import torch

from flcore.aggregation import named_tensors
from utils.errors import ConfigError
from utils.result_utils import read_results
from helpers import assert_lag_composes, in_use, play_round, server_for, state_equal, uploads_are, train, results_file


def snapshot(module):
    return copy.deepcopy(named_tensors(module))


def test_each_stage_changes_only_its_own_part_and_computes_no_gradient_for_the_other(data_dir, tmp_path):
    head_only = in_use(server_for(data_dir, tmp_path, "-algo", "FedRep", "-pls", "1", "-ls", "0").clients[0])
    base, head = snapshot(head_only.model.base), snapshot(head_only.model.head)
    head_only.train()
    assert state_equal(named_tensors(head_only.model.base), base)
    assert not state_equal(named_tensors(head_only.model.head), head)
    assert all(p.grad is None for p in head_only.model.base.parameters())

    base_only = in_use(server_for(data_dir, tmp_path, "-algo", "FedRep", "-pls", "0", "-ls", "1").clients[0])
    base, head = snapshot(base_only.model.base), snapshot(base_only.model.head)
    base_only.train()
    assert state_equal(named_tensors(base_only.model.head), head)
    assert not state_equal(named_tensors(base_only.model.base), base)
    assert all(p.grad is None for p in base_only.model.head.parameters())
    assert all(p.requires_grad for p in base_only.model.parameters())  # flags restored after training


def test_head_stage_runs_first_with_pls_epochs_then_base_stage_with_ls_epochs(data_dir, tmp_path):
    client = in_use(server_for(data_dir, tmp_path, "-algo", "FedRep", "-pls", "3", "-ls", "2", "-ld").clients[0])
    names = {id(p): n for n, p in client.model.named_parameters()}
    assert {names[id(p)] for p in client.head_optimizer.param_groups[0]["params"]} == \
        {f"head.{n}" for n, _ in client.model.head.named_parameters()}
    assert {names[id(p)] for p in client.optimizer.param_groups[0]["params"]} == \
        {f"base.{n}" for n, _ in client.model.base.named_parameters()}
    stages = []
    run_epochs = client.run_epochs

    def recording(epochs, loss_fn, optimizer=None):
        trainable = {n for n, p in client.model.named_parameters() if p.requires_grad}
        stages.append((epochs, optimizer, {n.split(".")[0] for n in trainable}))
        return run_epochs(epochs, loss_fn, optimizer)
    client.run_epochs = recording
    client.train()
    assert stages == [(3, client.head_optimizer, {"head"}), (2, client.optimizer, {"base"})]
    lr, gamma = client.learning_rate, client.learning_rate_decay_gamma
    assert client.head_optimizer.param_groups[0]["lr"] == pytest.approx(lr * gamma)
    assert client.optimizer.param_groups[0]["lr"] == pytest.approx(lr * gamma)


def test_head_optimiser_and_its_decay_survive_a_state_round_trip(data_dir, tmp_path):
    trained = in_use(server_for(data_dir, tmp_path, "-algo", "FedRep", "-ld", "-ldg", "0.5").clients[0])
    trained.train()
    fresh = server_for(data_dir, tmp_path, "-algo", "FedRep", "-ld", "-ldg", "0.5").clients[0]
    fresh.set_state(trained.get_state())
    assert fresh.head_optimizer.param_groups[0]["lr"] == pytest.approx(0.5 * trained.learning_rate)
    assert fresh.head_scheduler.last_epoch == 1
    assert state_equal(fresh.module_tensors(), trained.module_tensors())


def test_fine_tuning_a_new_client_trains_base_and_head(data_dir, tmp_path):
    client = in_use(server_for(data_dir, tmp_path, "-algo", "FedRep").clients[0])
    base, head = snapshot(client.model.base), snapshot(client.model.head)
    client.fine_tune(1)
    assert not state_equal(named_tensors(client.model.base), base)
    assert not state_equal(named_tensors(client.model.head), head)


def test_server_averages_uploaded_bases_and_resets_uploads_every_round(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedRep", "-jr", "0.5")
    initial_head = snapshot(server.global_model.head)
    by_id = {c.id: c for c in server.clients}
    for _ in range(2):
        play_round(server)
        assert server.uploader_ids() == [c.id for c in server.selected_clients]  # PFLlib kept appending
        assert uploads_are(server, lambda c: in_use(c).model.base)
        total = sum(by_id[i].train_samples for i in server.uploader_ids())
        for name, value in server.global_model.base.named_parameters():
            expected = sum(by_id[i].module_tensors()[f"base.{name}"] * (by_id[i].train_samples / total)
                           for i in server.uploader_ids())
            assert torch.allclose(value, expected, atol=1e-6), name
    assert state_equal(named_tensors(server.global_model.head), initial_head)


def test_a_round_without_uploads_leaves_the_global_base_alone(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedRep", "-jr", "0.2", "-cdr", "0.5")
    before = snapshot(server.global_model)
    play_round(server)  # one client selected, int(0.5 * 1) = 0 kept
    assert server.uploads == [] and server.upload_weights == []
    assert state_equal(named_tensors(server.global_model), before)


def test_negative_head_epochs_are_refused(data_dir, tmp_path):
    with pytest.raises(ConfigError, match="-pls"):
        server_for(data_dir, tmp_path, "-algo", "FedRep", "-pls", "-1")


def test_fedrep_lag_personalises_base_tensors_and_heads_stay_local(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedRep+LAG", "-m", "CNN", "-jr", "0.5", "--lag_top_k", "4")  # + its head
    personal = assert_lag_composes(server, k=2)
    assert all(name.startswith("base.") for name in personal)


def test_end_to_end_run_records_finite_results(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedRep", "-gr", "1", "-pls", "2")
    train(server)
    arrays, _ = read_results(results_file(server))
    assert arrays["rs_test_acc"].shape == (2,) and np.all(np.isfinite(arrays["rs_train_loss"]))
    assert arrays["rs_test_acc"][-1] > arrays["rs_test_acc"][0]
