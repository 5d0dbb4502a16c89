"""Ditto: the personal objective, which model each series reports, what the broadcast leaves alone, X+LAG."""
import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from flcore.aggregation import named_tensors
from utils.errors import ConfigError
from utils.result_utils import read_results
from helpers import assert_lag_composes, in_use, play_round, server_for, state_equal, train, results_file
from personal_checks import accuracy_of, train_loss_of, uniform_loss, wiggle_, zero_

MU = 0.3


def test_personal_step_descends_ce_plus_half_mu_squared_distance_to_the_received_model(data_dir, tmp_path):
    client = in_use(server_for(data_dir, tmp_path, "-algo", "Ditto", "-mu", str(MU)).clients[0])
    wiggle_(client.model_per)
    w = {n: p.detach().clone() for n, p in client.model.named_parameters()}
    v = {n: p.detach().clone() for n, p in client.model_per.named_parameters()}
    client.received = copy.deepcopy(w)
    x, y = client.train_data.x[:8], client.train_data.y[:8]

    distance = sum(float((v[n] - w[n]).pow(2).sum()) for n in v)
    assert distance > 0
    expected_loss = float(F.cross_entropy(client.model_per(x), y).detach()) + MU / 2 * distance
    assert float(client.personal_loss(x, y).detach()) == pytest.approx(expected_loss, rel=1e-5)

    probe = dict(copy.deepcopy(client.model_per).named_parameters())
    ce = F.cross_entropy(torch.func.functional_call(client.model_per, probe, (x,)), y)
    ce_grads = dict(zip(probe, torch.autograd.grad(ce, list(probe.values()))))
    lr = client.optimizer_per.param_groups[0]["lr"]
    client.optimizer_per.zero_grad()
    client.personal_loss(x, y).backward()
    client.optimizer_per.step()
    for name, param in client.model_per.named_parameters():
        expected = v[name] - lr * (ce_grads[name] + MU * (v[name] - w[name]))
        assert torch.allclose(param, expected, atol=1e-6), name
    assert state_equal(named_tensors(client.model), w)  # the personal step never moves w


def test_the_anchor_is_the_model_received_this_round_and_both_models_train(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "Ditto", "-mu", str(MU))
    server.selected_clients = server.select_clients()
    server.send_models()
    client = in_use(server.selected_clients[0])
    received = {n: p.detach().clone() for n, p in client.model.named_parameters()}
    personal = copy.deepcopy(named_tensors(client.model_per))
    client.train()  # the anchor itself: the next test
    assert not state_equal(named_tensors(client.model), received)
    assert not state_equal(named_tensors(client.model_per), personal)


def test_the_anchor_is_held_by_reference_and_stays_the_received_model_through_the_personal_step(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "Ditto", "-mu", str(MU), "-pls", "2")
    server.selected_clients = server.select_clients()
    server.send_models()
    client = in_use(server.selected_clients[0])
    received = {n: p.detach().clone() for n, p in client.model.named_parameters()}
    seen = []
    personal_loss = client.personal_loss

    def watched(x, y):
        params = dict(client.model.named_parameters())
        seen.append((all(t.data_ptr() == params[n].data_ptr() for n, t in client.received.items()),
                     state_equal(client.received, received)))
        return personal_loss(x, y)
    client.personal_loss = watched
    client.train()
    # Every step of both personal epochs saw views of w (no copy), holding the bits received.
    assert len(seen) >= 2 and all(view and equal for view, equal in seen)
    assert client.received == {}  # and none is kept after the step


def test_rs_test_acc_reports_the_personal_models_and_rs_global_the_received_global(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "Ditto", "-mu", str(MU))
    play_round(server)
    for client in server.clients:
        zero_(in_use(client).model_per)  # predicts class 0 everywhere: clearly not the global model
    server.send_models()
    server.evaluate()
    h = server.history
    assert h["rs_test_acc"][-1] == pytest.approx(accuracy_of(server.clients, lambda c: in_use(c).model_per))
    assert h["rs_train_loss"][-1] == pytest.approx(uniform_loss(server.num_classes), rel=1e-6)
    assert h["rs_global_test_acc"][-1] == pytest.approx(accuracy_of(server.clients, lambda c: in_use(c).model))
    assert h["rs_global_train_loss"][-1] == pytest.approx(train_loss_of(server.clients, lambda c: in_use(c).model), rel=1e-5)
    assert h["rs_test_acc"][-1] != h["rs_global_test_acc"][-1]
    assert len(h["rs_test_acc"]) == len(h["rs_global_test_acc"]) == 1  # one entry each, not interleaved


def test_broadcast_overwrites_the_global_copy_and_never_the_personal_model(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "Ditto", "-mu", str(MU))
    play_round(server)
    for client in server.clients:
        wiggle_(in_use(client).model)
    before = {c.id: copy.deepcopy(c.module_tensors("model_per")) for c in server.clients}
    server.send_models()
    for client in server.clients:
        assert state_equal(client.module_tensors("model_per"), before[client.id])
        assert state_equal(client.module_tensors(), named_tensors(server.global_model))


def test_ditto_plus_lag_personalises_k_global_tensors_and_leaves_the_personal_model_alone(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "Ditto+LAG", "-mu", str(MU), "--lag_top_k", "2")
    assert_lag_composes(server, k=2, private=lambda c: named_tensors(c.model_per))


def test_negative_mu_is_refused(data_dir, tmp_path):
    with pytest.raises(ConfigError, match="-mu"):
        server_for(data_dir, tmp_path, "-algo", "Ditto", "-mu", "-0.1")


def test_two_rounds_record_both_accuracies(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "Ditto", "-mu", str(MU), "-gr", "1")
    train(server)
    arrays, _ = read_results(results_file(server))
    for prefix in ("rs", "rs_global"):
        assert len(arrays[f"{prefix}_test_acc"]) == 2
        assert np.all((arrays[f"{prefix}_test_acc"] >= 0) & (arrays[f"{prefix}_test_acc"] <= 1))
        assert np.all(np.isfinite(arrays[f"{prefix}_train_loss"]))
    assert arrays["rs_train_loss"][1] < arrays["rs_train_loss"][0]  # the personal models learned
