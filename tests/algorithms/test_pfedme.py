"""pFedMe: the local update (K prox steps on theta, then w pulled to theta), the server's beta step,
the reported theta, the -bt refusal, X+LAG, and a short run."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from flcore.aggregation import named_tensors
from utils.errors import ConfigError
from utils.result_utils import read_results
from helpers import in_use, assert_lag_composes, play_round, server_for, state_equal, train, results_file
from personal_checks import accuracy_of, uniform_loss, zero_

FLAGS = ("-algo", "pFedMe", "-bt", "1", "-lam", "5", "-K", "3", "-lrp", "0.02")


def test_local_update_is_k_prox_steps_on_theta_then_w_moves_lr_lamda_towards_theta(data_dir, tmp_path):
    client = in_use(server_for(data_dir, tmp_path, *FLAGS).clients[0])
    lam, K, lrp, lr = 5.0, 3, 0.02, client.learning_rate
    batches = torch.Generator()
    batches.set_state(client.generator.get_state())  # the same batches the client will draw
    w = {n: p.detach().clone() for n, p in client.model.named_parameters()}
    theta = dict(w)  # theta starts each round from the received w
    for x, y in client.train_data.train_batches(client.batch_size, batches):
        for _ in range(K):
            leaves = {n: t.clone().requires_grad_(True) for n, t in theta.items()}
            loss = F.cross_entropy(functional_call(client.model, leaves, (x,)), y)
            loss = loss + lam / 2 * sum((leaves[n] - w[n]).pow(2).sum() for n in w)
            grads = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))
            theta = {n: theta[n] - lrp * grads[n] for n in theta}
        w = {n: w[n] - lr * lam * (w[n] - theta[n]) for n in w}

    client.train()
    for name, param in client.model_per.named_parameters():
        assert torch.allclose(param, theta[name], atol=1e-5), name
    for name, param in client.model.named_parameters():
        assert torch.allclose(param, w[name], atol=1e-5), name
    assert not state_equal(named_tensors(client.model), named_tensors(client.model_per))


def test_server_mixes_the_weighted_average_with_the_previous_global_model(data_dir, tmp_path):
    beta = 2.0  # extrapolation, as in the paper's experiments
    server = server_for(data_dir, tmp_path, *FLAGS[:2], "-bt", str(beta), "-jr", "0.5")
    server.selected_clients = server.select_clients()
    server.send_models()
    server.train_clients(server.selected_clients)
    server.receive_models()
    previous = {n: p.detach().clone() for n, p in server.global_model.named_parameters()}
    sizes = {c.id: c.train_samples for c in server.selected_clients}
    total = sum(sizes.values())
    average = {n: sum(sizes[c.id] / total * dict(in_use(c).model.named_parameters())[n].detach()
                      for c in server.selected_clients) for n in previous}
    server.aggregate_parameters()
    for name, param in server.global_model.named_parameters():
        assert torch.allclose(param, (1 - beta) * previous[name] + beta * average[name], atol=1e-6), name


def test_the_reported_model_is_the_personalised_theta(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, *FLAGS)
    play_round(server)
    for client in server.clients:
        zero_(in_use(client).model_per)
    server.send_models()
    server.evaluate()
    assert server.rs_test_acc[-1] == pytest.approx(accuracy_of(server.clients, lambda c: c.model_per))
    assert server.rs_train_loss[-1] == pytest.approx(uniform_loss(server.num_classes), rel=1e-6)
    assert server.rs_test_acc[-1] != pytest.approx(accuracy_of(server.clients, lambda c: c.model))


def test_beta_zero_pfllibs_shared_default_is_refused_with_a_hint_when_given(data_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"-bt/--beta .*must be > 0.*try -bt 1"):
        server_for(data_dir, tmp_path, "-algo", "pFedMe", "-bt", "0")
    with pytest.raises(ConfigError, match="-K"):
        server_for(data_dir, tmp_path, *FLAGS, "-K", "0")


def test_pfedme_plus_lag_personalises_k_tensors_of_w_and_leaves_theta_alone(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "pFedMe+LAG", *FLAGS[2:], "--lag_top_k", "2")
    assert_lag_composes(server, k=2, private=lambda c: named_tensors(c.model_per))


def test_two_rounds_improve_the_personalised_models(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, *FLAGS, "-gr", "1")
    train(server)
    arrays, _ = read_results(results_file(server))
    assert len(arrays["rs_test_acc"]) == 2 and np.all(np.isfinite(arrays["rs_train_loss"]))
    assert arrays["rs_train_loss"][1] < arrays["rs_train_loss"][0]
