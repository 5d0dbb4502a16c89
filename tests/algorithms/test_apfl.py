"""APFL: the joint w / v / alpha step, the reported mixture, X+LAG, and a short run."""
import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from flcore.aggregation import named_tensors
from utils.errors import ConfigError
from utils.result_utils import read_results
from helpers import assert_lag_composes, in_use, play_round, server_for, train, results_file
from personal_checks import accuracy_of, train_loss_of, wiggle_

ALPHA = 0.3


def grads_at(template, params, x, y):
    """{name: d CE / d param} of ``template`` run with ``params``."""
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in params.items()}
    loss = F.cross_entropy(functional_call(template, leaves, (x,)), y)
    return dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))


def test_one_step_moves_w_v_and_alpha_as_in_algorithm_1(data_dir, tmp_path):
    client = in_use(server_for(data_dir, tmp_path, "-algo", "APFL", "-al", str(ALPHA)).clients[0])
    wiggle_(client.model_local, scale=0.2)
    w = {n: p.detach().clone() for n, p in client.model.named_parameters()}
    v = {n: p.detach().clone() for n, p in client.model_local.named_parameters()}
    x, y = client.train_data.x[:10], client.train_data.y[:10]
    lr = client.learning_rate

    g_w = grads_at(client.model, w, x, y)
    g_mix = grads_at(client.model, {n: ALPHA * v[n] + (1 - ALPHA) * w[n] for n in w}, x, y)
    alpha_grad = sum(float(((v[n] - w[n]) * g_mix[n]).sum()) for n in w)
    expected_alpha = min(max(ALPHA - lr * alpha_grad, 0.0), 1.0)
    assert abs(expected_alpha - ALPHA) > 1e-5  # the case really moves alpha

    client.model.train()
    client.begin_local_training()
    client.optimizer.zero_grad()
    client.local_loss(x, y).backward()
    client.optimizer.step()
    client.after_step()

    assert client.alpha == pytest.approx(expected_alpha, abs=1e-6)
    for name, param in client.model.named_parameters():
        assert torch.allclose(param, w[name] - lr * g_w[name], atol=1e-6), name
    for name, param in client.model_local.named_parameters():
        assert torch.allclose(param, v[name] - lr * ALPHA * g_mix[name], atol=1e-6), name


def test_alpha_is_kept_in_the_unit_interval(data_dir, tmp_path):
    client = in_use(server_for(data_dir, tmp_path, "-algo", "APFL").clients[0])
    with torch.no_grad():
        client.mixing.alpha.fill_(1.7)
    client.after_step()
    assert client.alpha == 1.0


def test_the_reported_model_is_the_mixture_of_local_and_received_global(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "APFL", "-al", str(ALPHA))
    play_round(server)
    for client in server.clients:
        wiggle_(in_use(client).model_local, scale=0.5)
    server.send_models()

    def mixture(client):
        model = copy.deepcopy(in_use(client).model)
        local = dict(client.model_local.named_parameters())
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(client.alpha * local[name] + (1 - client.alpha) * param)
        return model

    server.evaluate()
    assert server.rs_test_acc[-1] == pytest.approx(accuracy_of(server.clients, mixture))
    assert server.rs_train_loss[-1] == pytest.approx(train_loss_of(server.clients, mixture), rel=1e-5)
    client = in_use(server.clients[0])
    reported = named_tensors(client.evaluation_model())
    expected = named_tensors(mixture(client))
    for name in expected:
        assert torch.allclose(reported[name], expected[name], atol=1e-6)
    assert not torch.equal(reported["fc.weight"], client.model.fc.weight)        # not w alone
    assert not torch.equal(reported["fc.weight"], client.model_local.fc.weight)  # not v alone


def test_apfl_plus_lag_personalises_k_global_tensors_and_leaves_v_and_alpha_alone(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "APFL+LAG", "-al", str(ALPHA), "--lag_top_k", "2")

    def private(client):
        state = {f"local.{n}": t for n, t in named_tensors(client.model_local).items()}
        return dict(state, alpha=client.mixing.alpha.detach())
    assert_lag_composes(server, k=2, private=private)


def test_alpha_outside_the_unit_interval_is_refused(data_dir, tmp_path):
    with pytest.raises(ConfigError, match="-al"):
        server_for(data_dir, tmp_path, "-algo", "APFL", "-al", "1.5")


def test_two_rounds_learn_alpha_and_record_it(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "APFL", "-al", "0.5", "-gr", "1")
    train(server)
    arrays, _ = read_results(results_file(server))
    assert len(arrays["rs_test_acc"]) == 2 and np.all(np.isfinite(arrays["rs_train_loss"]))
    alphas = arrays["apfl_alpha"]
    assert alphas.shape == (2, len(server.clients))
    assert np.all((alphas >= 0) & (alphas <= 1)) and not np.allclose(alphas, 0.5)
