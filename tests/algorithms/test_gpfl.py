"""GPFL: base, GCE and CoV shared; head personal; GCE angle and magnitude guidance; -mu on GCE/CoV."""
import copy

import numpy as np
import pytest
import torch

from flcore.aggregation import named_tensors, sample_weights
from utils.errors import ConfigError
from utils.result_utils import read_results
from helpers import in_use, assert_lag_composes, server_for, state_equal, train, results_file

SHARED_PREFIXES = ("base.", "gce.", "cov.")


def test_base_gce_and_cov_are_averaged_and_the_head_stays_local(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "GPFL", "-jr", "0.5")
    initial_head = copy.deepcopy(named_tensors(server.global_model.head))
    server.selected_clients = server.select_clients()
    server.send_models()
    server.train_clients(server.selected_clients)
    server.receive_models()
    server.aggregate_parameters()
    trained = server.selected_clients
    weights = sample_weights([c.train_samples for c in trained])
    global_state = named_tensors(server.global_model)
    shared = [n for n in global_state if n.startswith(SHARED_PREFIXES)]
    assert any(n.startswith("gce.") for n in shared) and any(n.startswith("cov.") for n in shared)
    for name in shared:
        expected = sum(w * named_tensors(in_use(c).model)[name] for w, c in zip(weights, trained))
        assert torch.allclose(global_state[name], expected, atol=1e-6), name
    assert state_equal(named_tensors(server.global_model.head), initial_head)

    heads = {c.id: copy.deepcopy(named_tensors(in_use(c).model.head)) for c in server.clients}
    server.send_models()
    for client in server.clients:
        state = named_tensors(client.model)
        assert state_equal(state, global_state, shared)
        assert state_equal(named_tensors(client.model.head), heads[client.id])
    assert not state_equal(heads[trained[0].id], initial_head)


def test_local_loss_matches_a_hand_computation(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "GPFL", "-lam", "0.3")
    client = in_use(server.clients[1])
    client.begin_local_training()
    with torch.no_grad():  # training moves the embeddings; the conditions must stay the received ones
        client.model.gce.embedding.weight.add_(0.5)
    x, y = client.train_data.x[:10], client.train_data.y[:10]
    loss = client.local_loss(x, y)
    with torch.no_grad():
        received = client.model.gce.embedding.weight - 0.5
        live = client.model.gce.embedding.weight
        counts = torch.bincount(client.train_data.y, minlength=live.shape[0]).float()
        generic = received.mean(0)
        personal = (counts / counts.sum()) @ received
        z = client.model.base(x)
        z_p = client.model.cov(z, personal)
        z_g = client.model.cov(z, generic)
        picked = torch.arange(len(y))
        ce = -torch.log_softmax(client.model.head(z_p), 1)[picked, y].mean()
        cosine = (z_g / z_g.norm(dim=1, keepdim=True)) @ (live / live.norm(dim=1, keepdim=True)).T
        angular = -torch.log_softmax(cosine, 1)[picked, y].mean()
        magnitude = torch.stack([(z_g[i] - received[y[i]]).pow(2).sum().sqrt() for i in range(len(y))]).mean()
        expected = ce + angular + 0.3 * magnitude
    assert torch.allclose(loss, expected, atol=1e-5)


def test_mu_is_weight_decay_on_gce_and_cov_only(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "GPFL", "-mu", "0.5", "-lr", "0.1")
    client = in_use(server.clients[0])
    before = copy.deepcopy(named_tensors(client.model))
    for param in client.model.parameters():
        param.grad = torch.zeros_like(param)
    client.optimizer.step()
    after = named_tensors(client.model)
    for name, value in after.items():
        decayed = name.startswith(("gce.", "cov."))
        expected = before[name] * (1 - 0.1 * 0.5) if decayed else before[name]
        assert torch.allclose(value, expected), name


def test_negative_lambda_is_refused(data_dir, tmp_path):
    with pytest.raises(ConfigError, match="-lam"):
        server_for(data_dir, tmp_path, "-algo", "GPFL", "-lam", "-1")


def test_gpfl_plus_lag_ranks_base_gce_and_cov_and_keeps_the_head(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "GPFL+LAG", "--lag_top_k", "5")  # + its head
    assert_lag_composes(server, k=3)
    candidates = {n for layer in server.lag_layers for n in layer.tensors}
    assert {n.split(".")[0] for n in candidates} == {"base", "gce", "cov"}


def test_end_to_end(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "GPFL", "-gr", "1", "-lam", "0.01", "-mu", "0.1")
    train(server)
    arrays, attrs = read_results(results_file(server))
    assert attrs["complete"] and len(arrays["rs_test_acc"]) == 2
    assert np.isfinite(arrays["rs_train_loss"]).all()
    assert arrays["rs_test_acc"][-1] > arrays["rs_test_acc"][0]
