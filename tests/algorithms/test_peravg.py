"""Per-FedAvg: the first-order meta-step, evaluation after one adaptation step (model restored),
the -bt refusal, X+LAG, and a short run."""
import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from flcore.aggregation import named_tensors
from utils.errors import ConfigError
from utils.result_utils import read_results
from helpers import in_use, assert_lag_composes, play_round, server_for, state_equal, train, results_file
from personal_checks import accuracy_of, train_loss_of

BETA = 0.2  # differs from -lr 0.05, so a swapped step size shows


def sgd_step(model, x, y, lr):
    """A copy of ``model`` after one plain SGD step on (x, y)."""
    moved = copy.deepcopy(model)
    grads = torch.autograd.grad(F.cross_entropy(moved(x), y), list(moved.parameters()))
    with torch.no_grad():
        for param, grad in zip(moved.parameters(), grads):
            param.sub_(lr * grad)
    return moved


def test_meta_step_applies_the_gradient_at_w_tilde_to_w(data_dir, tmp_path):
    client = server_for(data_dir, tmp_path, "-algo", "PerAvg", "-bt", str(BETA)).clients[0]
    in_use(client)
    x, y = client.train_data.x[:12], client.train_data.y[:12]
    (x1, y1), (x2, y2) = (x[:6], y[:6]), (x[6:], y[6:])
    w = {n: p.detach().clone() for n, p in client.model.named_parameters()}
    w_tilde = sgd_step(client.model, x1, y1, client.learning_rate)
    outer = dict(zip(w, torch.autograd.grad(F.cross_entropy(w_tilde(x2), y2), list(w_tilde.parameters()))))

    client.model.train()
    client.meta_step(x1, y1, x2, y2)
    for name, param in client.model.named_parameters():
        assert torch.allclose(param, w[name] - BETA * outer[name], atol=1e-6), name


def test_evaluation_reports_one_adapted_step_and_restores_everything(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "PerAvg", "-bt", str(BETA))
    play_round(server)
    server.send_models()
    before = {c.id: copy.deepcopy(named_tensors(in_use(c).model)) for c in server.clients}
    batch_order = {c.id: c.generator.get_state() for c in server.clients}
    adapted = {}
    for client in server.clients:
        stream = torch.Generator()
        stream.set_state(client.adaptation_generator.get_state())
        x, y = next(iter(client.train_data.train_batches(client.batch_size, stream)))
        adapted[client.id] = sgd_step(client.model, x, y, client.learning_rate)

    server.evaluate()
    assert server.rs_test_acc[-1] == pytest.approx(accuracy_of(server.clients, lambda c: adapted[c.id]))
    # Accuracy saturates on the toy data; the train loss shows which model was measured.
    assert server.rs_train_loss[-1] == pytest.approx(train_loss_of(server.clients, lambda c: adapted[c.id]), rel=1e-5)
    assert server.rs_train_loss[-1] != pytest.approx(train_loss_of(server.clients, lambda c: c.model), rel=1e-5)
    for client in server.clients:
        assert state_equal(named_tensors(client.model), before[client.id]), f"client {client.id} not restored"
        assert torch.equal(client.generator.get_state(), batch_order[client.id])  # training batches untouched


def test_beta_zero_pfllibs_shared_default_is_refused_when_given(data_dir, tmp_path):
    with pytest.raises(ConfigError, match="-bt/--beta .*must be > 0"):
        server_for(data_dir, tmp_path, "-algo", "PerAvg", "-bt", "0")


def test_peravg_plus_lag_personalises_k_tensors(data_dir, tmp_path):
    # PerAvg has no private model: its personalisation is the transient adaptation step, whose
    # batch stream is the only private state the broadcast must not touch.
    server = server_for(data_dir, tmp_path, "-algo", "PerAvg+LAG", "-bt", str(BETA), "--lag_top_k", "2")
    assert_lag_composes(server, k=2, private=lambda c: {"stream": c.adaptation_generator.get_state()})


def test_two_rounds_train_and_report(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "PerAvg", "-bt", str(BETA), "-gr", "1")
    start = copy.deepcopy(named_tensors(server.global_model))
    train(server)
    arrays, _ = read_results(results_file(server))
    assert len(arrays["rs_test_acc"]) == 2 and np.all(np.isfinite(arrays["rs_train_loss"]))
    assert not state_equal(named_tensors(server.global_model), start)
