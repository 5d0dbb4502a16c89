"""FedProx: the proximal gradient, mu = 0 is FedAvg, X+LAG, and a short run."""
import numpy as np
import pytest
import torch

from flcore.servers.serveravg import FedAvg
from utils.errors import ConfigError
from utils.result_utils import read_results
from helpers import assert_lag_composes, in_use, server_for, server_of_class, train_and_compare, train, results_file



def test_proximal_term_adds_mu_times_the_distance_to_the_received_global_model(data_dir, tmp_path):
    mu = 0.3
    server = server_for(data_dir, tmp_path, "-algo", "FedProx", "-mu", str(mu))
    server.selected_clients = server.select_clients()
    server.send_models()
    client = in_use(server.clients[1])
    client.begin_local_training()
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # move away from the global model, as local steps would
        for param in client.model.parameters():
            param.add_(0.1 * torch.randn(param.shape, generator=generator))
    x, y = client.train_data.x[:16], client.train_data.y[:16]

    def gradients(loss):
        client.model.zero_grad()
        loss.backward()
        return {n: p.grad.clone() for n, p in client.model.named_parameters()}
    with_prox = gradients(client.local_loss(x, y))
    plain = gradients(client.loss(client.model(x), y))
    global_params = dict(server.global_model.named_parameters())
    for name, param in client.model.named_parameters():
        expected = mu * (param.detach() - global_params[name].detach())
        assert expected.abs().max() > 0
        assert torch.allclose(with_prox[name] - plain[name], expected, atol=1e-6), name


def test_zero_mu_reproduces_fedavg_exactly(data_dir, tmp_path):
    common = ("-jr", "0.5", "-gr", "2")
    prox = server_for(data_dir, tmp_path / "prox", "-algo", "FedProx", "-mu", "0", *common)
    # FedAvg on the same unsplit model FedProx uses (the registry splits FedAvg's head off).
    fedavg = server_of_class(FedAvg, data_dir, tmp_path / "avg", "-algo", "FedAvg", *common, head_split=False)
    train_and_compare(prox, fedavg)


def test_lag_composes_with_fedprox(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedProx+LAG", "-mu", "0.1", "--lag_top_k", "2")
    assert_lag_composes(server, k=2)


def test_proximal_term_limits_how_far_local_training_drifts(data_dir, tmp_path):
    def drift(mu: str) -> float:
        server = server_for(data_dir, tmp_path, "-algo", "FedProx", "-mu", mu, "-ls", "2")
        server.selected_clients = server.select_clients()
        server.send_models()
        client = in_use(server.clients[0])
        client.train()
        start = dict(server.global_model.named_parameters())
        with torch.no_grad():
            return sum(float((p - start[n]).pow(2).sum()) for n, p in client.model.named_parameters())
    assert drift("2.0") < 0.7 * drift("0")


def test_short_run_records_accuracy(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedProx", "-mu", "0.1", "-gr", "1")
    train(server)
    arrays, _ = read_results(results_file(server))
    assert len(arrays["rs_test_acc"]) == 2 and np.isfinite(arrays["rs_train_loss"]).all()
    assert arrays["rs_test_acc"][1] > arrays["rs_test_acc"][0]
    assert all(client.received_model is None for client in server.clients)  # released after training


def test_negative_mu_is_refused(data_dir, tmp_path):
    with pytest.raises(ConfigError, match="-mu"):
        server_for(data_dir, tmp_path, "-algo", "FedProx", "-mu", "-0.5")
