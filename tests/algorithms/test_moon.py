"""MOON: the model-contrastive term by hand, the previous local model as client state, X+LAG, a run."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from flcore.aggregation import named_tensors
from flcore.clients.clientmoon import model_contrastive_loss
from utils.errors import ConfigError
from utils.result_utils import read_results
from helpers import in_use, assert_lag_composes, original_and_restored_twin, play_round, server_for, state_equal, train, results_file


def test_contrastive_loss_matches_a_hand_computation():
    z = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    z_global = torch.tensor([[1.0, 0.0], [1.0, 0.0]])     # cos 1 and 1/sqrt(2)
    z_previous = torch.tensor([[0.0, 1.0], [-1.0, -1.0]])  # cos 0 and -1
    tau = 0.5
    rows = [-math.log(math.exp(1 / tau) / (math.exp(1 / tau) + math.exp(0 / tau))),
            -math.log(math.exp(2 ** -0.5 / tau) / (math.exp(2 ** -0.5 / tau) + math.exp(-1 / tau)))]
    assert model_contrastive_loss(z, z_global, z_previous, tau).item() == pytest.approx(sum(rows) / 2, rel=1e-6)
    # Features equally close to both models carry no signal: log 2 whatever tau.
    assert model_contrastive_loss(z, z, z, 3.0).item() == pytest.approx(math.log(2), rel=1e-6)


def test_local_loss_is_cross_entropy_plus_mu_times_the_contrast_of_global_and_previous_features(data_dir, tmp_path):
    mu, tau = 2.0, 0.5
    server = server_for(data_dir, tmp_path, "-algo", "MOON", "-mu", str(mu), "-tau", str(tau))
    server.selected_clients = server.select_clients()
    server.send_models()
    client = in_use(server.clients[0])
    client.begin_local_training()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # three different models: local, global, previous
        for tensor in list(client.model.parameters()) + list(client.previous_base.parameters()):
            tensor.add_(0.2 * torch.randn(tensor.shape, generator=generator))
    x, y = client.train_data.x[:12], client.train_data.y[:12]
    with torch.no_grad():
        z = client.model.base(x)
        positive = F.cosine_similarity(z, server.global_model.base(x), dim=1) / tau
        negative = F.cosine_similarity(z, client.previous_base(x), dim=1) / tau
        contrast = (-torch.log(positive.exp() / (positive.exp() + negative.exp()))).mean()
        expected = F.cross_entropy(client.model(x), y) + mu * contrast
        assert contrast.item() != pytest.approx(math.log(2), abs=1e-3)
        assert client.local_loss(x, y).item() == pytest.approx(expected.item(), rel=1e-5)


def test_previous_model_is_the_clients_last_trained_base_and_survives_the_broadcast(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "MOON", "-mu", "1", "-jr", "0.5")
    initial = {n: t.clone() for n, t in named_tensors(server.global_model.base).items()}
    play_round(server)
    trained = {c.id for c in server.selected_clients}
    for client in server.clients:
        previous = named_tensors(in_use(client).previous_base)
        if client.id in trained:
            assert state_equal(previous, named_tensors(client.model.base))
        else:
            assert state_equal(previous, initial)
    kept = {c.id: {n: t.clone() for n, t in named_tensors(c.previous_base).items()} for c in server.clients}
    server.send_models()
    for client in server.clients:
        assert state_equal(named_tensors(client.previous_base), kept[client.id])


def test_lag_composes_with_moon_and_keeps_each_previous_model(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "MOON+LAG", "-m", "CNN", "-mu", "1", "-tau", "0.5",
                        "--lag_top_k", "2")
    assert_lag_composes(server, k=2, private=lambda client: named_tensors(client.previous_base))


def test_short_runs_zero_mu_is_fedavg_and_the_contrast_acts_once_previous_differs_from_global(data_dir, tmp_path):
    def run(folder, *flags):
        server = server_for(data_dir, tmp_path / folder, *flags, "-gr", "2")
        train(server)
        return read_results(results_file(server))[0]
    fedavg = run("avg", "-algo", "FedAvg")
    plain = run("zero", "-algo", "MOON", "-mu", "0")
    moon = run("moon", "-algo", "MOON", "-mu", "1", "-tau", "0.5")
    for name in ("rs_test_acc", "rs_test_auc", "rs_train_loss"):
        assert np.array_equal(plain[name], fedavg[name]), name
    assert np.isfinite(moon["rs_train_loss"]).all() and len(moon["rs_test_acc"]) == 3
    # Round 0 trains with previous = initial = global, where the contrast has zero gradient, so the
    # model evaluated in round 1 is FedAvg's; from round 1 on the previous model is the client's own.
    assert np.array_equal(moon["rs_train_loss"][:2], fedavg["rs_train_loss"][:2])
    assert moon["rs_train_loss"][2] != fedavg["rs_train_loss"][2]


def test_a_server_restored_from_state_continues_exactly(data_dir, tmp_path):
    flags = ("-algo", "MOON", "-mu", "1", "-jr", "0.5")
    original, twin = original_and_restored_twin(data_dir, tmp_path, *flags)
    assert state_equal(named_tensors(original.global_model), named_tensors(twin.global_model))
    for a, b in zip(original.clients, twin.clients):
        assert state_equal(named_tensors(in_use(a).previous_base), named_tensors(in_use(b).previous_base)), a.id


def test_non_positive_temperature_is_refused(data_dir, tmp_path):
    with pytest.raises(ConfigError, match="-tau"):
        server_for(data_dir, tmp_path, "-algo", "MOON", "-tau", "0")
