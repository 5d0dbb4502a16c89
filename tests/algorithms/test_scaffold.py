"""SCAFFOLD: one corrected step and option II by hand, the server step, the c = mean(c_i) invariant,
X+LAG, and a run."""
import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from utils.errors import ConfigError
from utils.result_utils import read_results
from helpers import in_use, assert_lag_composes, original_and_restored_twin, server_for, state_equal, train, results_file


def random_like(tensors, generator, scale=0.1):
    return {n: scale * torch.randn(t.shape, generator=generator) for n, t in tensors.items()}


def test_one_step_is_corrected_and_option_two_recovers_the_gradient(data_dir, tmp_path):
    lr = 0.05
    # A batch larger than any client: exactly one local step on all of the client's samples.
    server = server_for(data_dir, tmp_path, "-algo", "SCAFFOLD", "-lr", str(lr), "-lbs", "1000", "-ls", "1")
    client = server.clients[3]
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, value in random_like(server.control, generator).items():
            server.control[name].copy_(value)
        client.control = random_like(client.control, generator)  # its own c_i (the zeros it held are shared)
    c, c_i = copy.deepcopy(server.control), copy.deepcopy(client.control)
    server.selected_clients = server.select_clients()
    assert client in server.selected_clients
    server.send_models()
    start = copy.deepcopy(in_use(client).model)
    F.cross_entropy(start(client.train_data.x), client.train_data.y).backward()
    gradient = {n: p.grad for n, p in start.named_parameters()}
    update = client.train()
    assert client.local_steps == 1
    for name, param in client.model.named_parameters():
        x = dict(start.named_parameters())[name].detach()
        expected = x - lr * (gradient[name] + c[name] - c_i[name])
        assert torch.allclose(param.detach(), expected, atol=1e-6), name
        # Option II with K = 1: c_i+ = c_i - c + (x - y) / lr = g.
        assert torch.allclose(client.control[name], gradient[name], atol=1e-5), name
        assert torch.allclose(update.extras["control_delta"][name], gradient[name] - c_i[name], atol=1e-5), name
        assert not client.control_delta[name].any()  # handed over in the upload, not kept


def test_server_step_uses_the_mean_model_delta_and_the_control_deltas_over_all_clients(data_dir, tmp_path):
    slr, num_clients = 0.5, 6
    server = server_for(data_dir, tmp_path, "-algo", "SCAFFOLD", "-slr", str(slr), "-jr", "0.5")
    for _ in range(2):
        server.selected_clients = server.select_clients()
        server.send_models()
        x = {n: p.detach().clone() for n, p in server.global_model.named_parameters()}
        c = copy.deepcopy(server.control)
        server.train_clients(server.selected_clients)
        server.receive_models()
        uploads = [{n: t.clone() for n, t in u.tensors.items()} for u in server.uploads]
        deltas = copy.deepcopy(server.uploaded_control_deltas)
        assert len(uploads) == 3
        server.aggregate_parameters()
        for name, param in server.global_model.named_parameters():
            mean_delta = sum(u[name] - x[name] for u in uploads) / len(uploads)
            assert torch.allclose(param.detach(), x[name] + slr * mean_delta, atol=1e-6), name
            expected_c = c[name] + sum(d[name] for d in deltas) / num_clients
            assert torch.allclose(server.control[name], expected_c, atol=1e-6), name


def test_lag_composes_with_scaffold_and_keeps_each_clients_control_variate(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "SCAFFOLD+LAG", "--lag_top_k", "2")
    assert_lag_composes(server, k=2, private=lambda client: dict(client.control))


def test_short_run_keeps_c_the_mean_of_all_client_controls_and_new_clients_fine_tune_uncorrected(
        data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "SCAFFOLD", "-jr", "0.5", "-gr", "2", "-nc", "5",
                        "-nnc", "1", "-ften", "1")
    train(server)
    arrays, _ = read_results(results_file(server))
    assert len(arrays["rs_test_acc"]) == 3 and np.isfinite(arrays["rs_train_loss"]).all()
    assert len(arrays["rs_new_test_acc"]) == 1
    # c starts at 0 = mean of the c_i and each round adds the participants' changes over N.
    for name, c in server.control.items():
        mean_ci = sum(in_use(client).control[name] for client in server.clients) / len(server.clients)
        assert c.abs().max() > 0
        assert torch.allclose(c, mean_ci, atol=1e-6), name
    new_client = server.new_clients[0]
    assert new_client.local_steps == 0
    assert all(t.abs().max() == 0 for t in new_client.control.values())


def test_a_server_restored_from_state_continues_exactly(data_dir, tmp_path):
    flags = ("-algo", "SCAFFOLD", "-jr", "0.5")
    original, twin = original_and_restored_twin(data_dir, tmp_path, *flags)
    assert state_equal(dict(original.global_model.named_parameters()), dict(twin.global_model.named_parameters()))
    assert state_equal(original.control, twin.control)
    for a, b in zip(original.clients, twin.clients):
        assert state_equal(in_use(a).control, in_use(b).control), a.id


def test_non_positive_server_learning_rate_is_refused(data_dir, tmp_path):
    with pytest.raises(ConfigError, match="-slr"):
        server_for(data_dir, tmp_path, "-algo", "SCAFFOLD", "-slr", "0")
