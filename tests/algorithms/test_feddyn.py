"""FedDyn: the server's h and global model, the client's regulariser and gradient state, X+LAG, a run."""
import copy

import numpy as np
import pytest
import torch

from utils.errors import ConfigError
from utils.result_utils import read_results
from helpers import assert_lag_composes, in_use, original_and_restored_twin, server_for, state_equal, train, results_file


def test_server_step_matches_the_paper_update_over_two_rounds(data_dir, tmp_path):
    alpha, num_clients = 0.5, 6
    server = server_for(data_dir, tmp_path, "-algo", "FedDyn", "-al", str(alpha), "-jr", "0.5")
    h = {n: torch.zeros_like(p) for n, p in server.global_model.named_parameters()}
    for _ in range(2):  # the second round starts from a non-zero h
        server.selected_clients = server.select_clients()
        server.send_models()
        previous = {n: p.detach().clone() for n, p in server.global_model.named_parameters()}
        server.train_clients(server.selected_clients)
        server.receive_models()
        uploads = [u.tensors for u in server.uploads]
        assert len(uploads) == 3
        server.aggregate_parameters()
        for name, param in server.global_model.named_parameters():
            drift = sum(u[name].detach() - previous[name] for u in uploads)
            h[name] = h[name] - alpha / num_clients * drift
            mean = sum(u[name].detach() for u in uploads) / len(uploads)
            assert torch.allclose(server.server_state[name], h[name], atol=1e-6), name
            assert torch.allclose(param.detach(), mean - h[name] / alpha, atol=1e-6), name
    assert any(t.abs().max() > 0 for t in h.values())


def test_client_regulariser_and_gradient_state_follow_the_paper(data_dir, tmp_path):
    alpha = 0.3
    server = server_for(data_dir, tmp_path, "-algo", "FedDyn", "-al", str(alpha))
    server.selected_clients = server.select_clients()
    server.send_models()
    client = in_use(server.clients[2])
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for g in client.previous_gradient.values():
            g.copy_(torch.randn(g.shape, generator=generator))
    client.begin_local_training()
    with torch.no_grad():
        for param in client.model.parameters():
            param.add_(0.1 * torch.randn(param.shape, generator=generator))

    def flat(tensors):
        return torch.cat([t.detach().reshape(-1) for t in tensors])
    w = flat(p for _, p in client.model.named_parameters())
    w_global = flat(p for _, p in server.global_model.named_parameters())
    g = flat(client.previous_gradient[n] for n, _ in client.model.named_parameters())
    expected = -torch.dot(w, g) + alpha / 2 * torch.sum((w - w_global) ** 2)
    assert torch.allclose(client.dynamic_regulariser().detach(), expected, atol=1e-5)

    # After real local training: g <- g - alpha * (w_after - w_start).
    client.set_parameters(server.broadcast())
    g_before = copy.deepcopy(client.previous_gradient)
    start = {n: p.detach().clone() for n, p in client.model.named_parameters()}
    client.train()
    for name, param in client.model.named_parameters():
        expected_g = g_before[name] - alpha * (param.detach() - start[name])
        assert torch.allclose(client.previous_gradient[name], expected_g, atol=1e-6), name
        assert not torch.equal(client.previous_gradient[name], g_before[name])


def test_lag_composes_with_feddyn_and_keeps_each_clients_gradient_state(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedDyn+LAG", "-al", "0.1", "--lag_top_k", "2")
    assert_lag_composes(server, k=2, private=lambda client: dict(client.previous_gradient))


def test_short_run_records_results_and_keeps_server_state(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedDyn", "-al", "0.1", "-gr", "2")
    train(server)
    arrays, _ = read_results(results_file(server))
    assert len(arrays["rs_test_acc"]) == 3 and np.isfinite(arrays["rs_train_loss"]).all()
    assert arrays["rs_test_acc"][-1] > arrays["rs_test_acc"][0]
    assert all(torch.isfinite(h).all() for h in server.server_state.values())
    assert any(h.abs().max() > 0 for h in server.server_state.values())
    assert "server_state" in server.get_state()


def test_a_server_restored_from_state_continues_exactly(data_dir, tmp_path):
    flags = ("-algo", "FedDyn", "-al", "0.1", "-jr", "0.5")
    original, twin = original_and_restored_twin(data_dir, tmp_path, *flags)
    assert state_equal(dict(original.global_model.named_parameters()), dict(twin.global_model.named_parameters()))
    assert state_equal(original.server_state, twin.server_state)
    for a, b in zip(original.clients, twin.clients):
        assert state_equal(in_use(a).previous_gradient, in_use(b).previous_gradient), a.id


@pytest.mark.parametrize("alpha", ["0", "-1"])
def test_non_positive_alpha_is_refused(data_dir, tmp_path, alpha):
    with pytest.raises(ConfigError, match="-al"):
        server_for(data_dir, tmp_path, "-algo", "FedDyn", "-al", alpha)
