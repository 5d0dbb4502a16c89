"""FedAMP: attention-weighted cloud models u_i from a kernel of model distances, proximal pull to u_i."""
import math

import pytest
import torch

from flcore.servers.serveramp import attention_weights
from utils.errors import ConfigError
from utils.result_utils import read_results
from helpers import assert_lag_composes, in_use, perturb_all_clients, server_for, train, results_file


def test_attention_weights_and_cloud_models_match_a_hand_computation_of_the_kernel(data_dir, tmp_path):
    alpha, sigma = 0.1, 1.5
    server = server_for(data_dir, tmp_path, "-algo", "FedAMP", "-alk", str(alpha), "-sg", str(sigma), "-jr", "0.5")
    # Every client starts from the same model; the perturbation adds 0.01 * (id + 1) to every entry, so
    # ||w_i - w_j||^2 = D * (0.01 * (i - j))^2 with D the number of parameter entries.
    perturb_all_clients(server)
    entries = sum(p.numel() for p in server.global_model.parameters())
    n = len(server.clients)
    xi = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        for j in range(n):
            if i != j:
                xi[i, j] = alpha * math.exp(-entries * (0.01 * (i - j)) ** 2 / sigma) / sigma
        xi[i, i] = 1 - xi[i].sum()
    assert 0.01 < xi[0, 1] < xi[0, 0] < 1  # a case where the kernel really matters
    server.selected_clients = server.select_clients()
    server.send_models()
    weights = [dict(c.model.named_parameters()) for c in server.clients]
    for client in server.clients:
        if client not in server.selected_clients:
            assert client.cloud_model == {}
            continue
        for name, u in client.cloud_model.items():
            expected = sum(float(xi[client.id, j]) * weights[j][name].detach() for j in range(n))
            assert torch.allclose(u, expected, atol=1e-5), (client.id, name)
    selected = [c.id for c in server.selected_clients]
    assert server.history["rs_amp_self_weight"][-1] == pytest.approx(float(xi[selected, selected].mean()), rel=1e-4)

    # The pure function, on distances given directly.
    distances = torch.tensor([[0.0, 2.0, 4.0], [1.0, 3.0, 0.0]], dtype=torch.float64)
    got = attention_weights(distances, [0, 2], alphaK=0.5, sigma=2.0)
    off = lambda d: 0.5 * math.exp(-d / 2.0) / 2.0
    assert torch.allclose(got[0], torch.tensor([1 - off(2) - off(4), off(2), off(4)], dtype=torch.float64))
    assert torch.allclose(got[1], torch.tensor([off(1), off(3), 1 - off(1) - off(3)], dtype=torch.float64))


def test_local_loss_adds_lamda_over_two_alphak_times_the_squared_distance_to_u_with_its_gradient(data_dir, tmp_path):
    lamda, alpha = 0.4, 0.2
    server = server_for(data_dir, tmp_path, "-algo", "FedAMP", "-lam", str(lamda), "-alk", str(alpha))
    client = in_use(server.clients[0])
    noise = torch.Generator().manual_seed(5)
    client.receive_cloud_model({n: p.detach() + torch.randn(p.shape, generator=noise)
                                for n, p in client.model.named_parameters()})
    x, y = client.train_data.x[:10], client.train_data.y[:10]
    ce = torch.nn.functional.cross_entropy(client.model(x), y)
    squared = sum(((p - client.cloud_model[n]) ** 2).sum() for n, p in client.model.named_parameters())
    extra = client.local_loss(x, y) - ce
    assert torch.allclose(extra, lamda / (2 * alpha) * squared, rtol=1e-5)
    grads = torch.autograd.grad(extra, list(client.model.parameters()))
    for (name, p), g in zip(client.model.named_parameters(), grads):  # PFLlib's version has no gradient here
        assert torch.allclose(g, lamda / alpha * (p - client.cloud_model[name]), atol=1e-5), name


def test_fedamp_plus_lag_neither_compares_nor_pulls_the_personal_layers(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedAMP+LAG", "-alk", "0.1", "--lag_top_k", "2")
    personal = assert_lag_composes(server, k=2)
    all_names = {n for n, _ in server.clients[0].model.named_parameters()}
    for client in server.selected_clients:
        assert set(client.cloud_model) == all_names - personal


def test_sigma_out_of_range_is_refused_by_name(data_dir, tmp_path):
    with pytest.raises(ConfigError, match="-sg/--sigma"):
        server_for(data_dir, tmp_path, "-algo", "FedAMP", "-sg", "0")


def test_two_rounds_end_to_end(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedAMP", "-gr", "1", "-alk", "0.1", "-lam", "0.05")
    train(server)
    arrays, _ = read_results(results_file(server))
    assert len(arrays["rs_test_acc"]) == 2 and arrays["rs_test_acc"][1] > 0.5  # 4 classes: chance 0.25
    assert all(torch.isfinite(torch.as_tensor(arrays["rs_train_loss"])))
    # Round 0: all models equal, so xi_ij = alphaK / sigma for the 5 others and xi_ii = 1 - 5 * 0.1.
    assert arrays["rs_amp_self_weight"][0] == pytest.approx(0.5)
    assert arrays["rs_amp_self_weight"][1] > 0.5  # models drifted apart: less attention to others
