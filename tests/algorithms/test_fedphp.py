"""FedPHP: the HPM's inheritance step, the MMD transfer term, the reported HPM, X+LAG, a short run."""
import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from flcore.aggregation import named_tensors
from flcore.clients.clientphp import mmd_rbf
from utils.errors import ConfigError
from utils.result_utils import read_results
from helpers import assert_lag_composes, in_use, play_round, server_for, state_equal, train, results_file
from personal_checks import accuracy_of, uniform_loss, wiggle_, zero_

FLAGS = ("-algo", "FedPHP", "-lam", "0.1", "-mu", "0.9")


def hand_mmd(a: torch.Tensor, b: torch.Tensor) -> float:
    """MMD with five Gaussian kernels around the mean squared distance, one pair at a time."""
    points = list(torch.cat([a, b]).double())
    n, size = len(points), len(a)
    d2 = [[float((p - q).pow(2).sum()) for q in points] for p in points]
    mean = sum(d2[i][j] for i in range(n) for j in range(n) if i != j) / (n * n - n) + 1e-8
    widths = [mean / 4 * 2 ** i for i in range(5)]

    def block(rows, cols):
        return sum(math.exp(-d2[i][j] / s) for i in rows for j in cols for s in widths) / (len(rows) * len(cols))
    first, second = range(size), range(size, n)
    return block(first, first) + block(second, second) - 2 * block(first, second)


def test_hpm_inherits_mu_c_of_itself_and_the_rest_from_the_trained_model(data_dir, tmp_path):
    client = in_use(server_for(data_dir, tmp_path, *FLAGS, "-gr", "10").clients[0])
    client.participations = 3
    mu_c = 0.9 * 3 / 10  # -mu * participations / (jr * gr)
    wiggle_(client.model_hpm, scale=0.3)
    hpm_before = copy.deepcopy(named_tensors(client.model_hpm))
    client.train()
    trained = named_tensors(client.model)
    for name, tensor in named_tensors(client.model_hpm).items():
        assert torch.allclose(tensor, mu_c * hpm_before[name] + (1 - mu_c) * trained[name], atol=1e-6), name
    assert client.participations == 4
    client.participations = 50
    assert client.inheritance_weight() == pytest.approx(0.9)  # capped at -mu


def test_the_server_tells_every_client_how_often_it_takes_part(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, *FLAGS, "-gr", "10", "-jr", "0.5")
    newcomers = server.set_clients([0])  # as -nnc builds them
    assert {c.expected_participations for c in server.clients + newcomers} == {5}  # int(jr * gr)


def test_local_loss_is_weighted_ce_plus_mmd_to_the_hpm_features(data_dir, tmp_path):
    client = in_use(server_for(data_dir, tmp_path, *FLAGS).clients[0])
    wiggle_(client.model_hpm, scale=0.3)
    x, y = client.train_data.x[:8], client.train_data.y[:8]
    with torch.no_grad():
        features, teacher = client.model.base(x), client.model_hpm.eval().base(x)
        ce = float(F.cross_entropy(client.model.head(features), y))
        expected = 0.9 * ce + 0.1 * hand_mmd(features, teacher)
        assert float(client.local_loss(x, y)) == pytest.approx(expected, rel=1e-4)
        assert float(mmd_rbf(features, features)) == pytest.approx(0.0, abs=1e-6)
        assert hand_mmd(features, teacher) > 1e-4  # the transfer term is really there


def test_the_reported_model_is_the_hpm(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, *FLAGS)
    play_round(server)
    for client in server.clients:
        zero_(in_use(client).model_hpm)
    server.send_models()
    server.evaluate()
    assert server.rs_test_acc[-1] == pytest.approx(accuracy_of(server.clients, lambda c: in_use(c).model_hpm))
    assert server.rs_train_loss[-1] == pytest.approx(uniform_loss(server.num_classes), rel=1e-6)


def test_fedphp_plus_lag_personalises_k_tensors_and_leaves_the_hpm_alone(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedPHP+LAG", *FLAGS[2:], "--lag_top_k", "2")
    assert_lag_composes(server, k=2, private=lambda c: named_tensors(c.model_hpm))


def test_lamda_one_pfllibs_shared_default_is_refused_when_given(data_dir, tmp_path):
    with pytest.raises(ConfigError, match="-lam/--lamda .*must be in \\[0, 1\\)"):
        server_for(data_dir, tmp_path, "-algo", "FedPHP", "-lam", "1")


def test_two_rounds_build_hpms_apart_from_the_shared_models(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, *FLAGS, "-gr", "1")
    train(server)
    arrays, _ = read_results(results_file(server))
    assert len(arrays["rs_test_acc"]) == 2 and np.all(np.isfinite(arrays["rs_train_loss"]))
    assert arrays["rs_train_loss"][1] < arrays["rs_train_loss"][0]
    for client in server.clients:
        assert client.participations == 2
        # Round 1 inherits with mu_c = 0.9, so the HPM is no longer the last trained model.
        assert not state_equal(client.module_tensors("model_hpm"), client.module_tensors())
