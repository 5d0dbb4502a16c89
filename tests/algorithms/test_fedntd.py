"""FedNTD: the not-true distillation term by hand (true class excluded), the client loss, X+LAG, a run."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from flcore.clients.clientntd import not_true_distillation, not_true_logits
from flcore.servers.serveravg import FedAvg
from utils.errors import ConfigError
from utils.result_utils import read_results
from helpers import assert_lag_composes, in_use, server_for, server_of_class, train, results_file


def softmax(values, tau):
    exps = [math.exp(v / tau) for v in values]
    return [e / sum(exps) for e in exps]


def kl(p, q):
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))


def test_not_true_distillation_matches_a_hand_computation():
    local = torch.tensor([[1.0, 2.0, 3.0], [-1.0, 5.0, 0.0]])
    teacher = torch.tensor([[0.5, 0.0, 1.0], [2.0, -3.0, 1.0]])
    targets = torch.tensor([0, 1])
    tau = 2.0
    # Not-true classes: row 0 drops class 0, row 1 drops class 1.
    rows = [kl(softmax([0.0, 1.0], tau), softmax([2.0, 3.0], tau)),
            kl(softmax([2.0, 1.0], tau), softmax([-1.0, 0.0], tau))]
    expected = tau ** 2 * sum(rows) / 2
    assert not_true_distillation(local, teacher, targets, tau).item() == pytest.approx(expected, rel=1e-6)
    assert torch.equal(not_true_logits(local, targets), torch.tensor([[2.0, 3.0], [-1.0, 0.0]]))


def test_the_true_class_logit_has_no_influence():
    generator = torch.Generator().manual_seed(0)
    local, teacher = torch.randn(8, 5, generator=generator), torch.randn(8, 5, generator=generator)
    targets = torch.arange(8) % 5
    base = not_true_distillation(local, teacher, targets, 1.5)
    rows = torch.arange(8)
    moved_local, moved_teacher = local.clone(), teacher.clone()
    moved_local[rows, targets] += 7.0
    moved_teacher[rows, targets] -= 4.0
    assert torch.allclose(not_true_distillation(moved_local, moved_teacher, targets, 1.5), base, atol=1e-6)
    # ...while the same change on a not-true class does move it.
    moved_local[rows, (targets + 1) % 5] += 7.0
    assert not torch.allclose(not_true_distillation(moved_local, teacher, targets, 1.5), base, atol=1e-3)


def test_local_loss_adds_beta_times_the_term_against_the_received_global_model(data_dir, tmp_path):
    beta, tau = 0.7, 3.0
    server = server_for(data_dir, tmp_path, "-algo", "FedNTD", "-bt", str(beta), "-tau", str(tau))
    server.selected_clients = server.select_clients()
    server.send_models()
    client = in_use(server.clients[4])
    client.begin_local_training()
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for param in client.model.parameters():
            param.add_(0.3 * torch.randn(param.shape, generator=generator))
    x, y = client.train_data.x[:20], client.train_data.y[:20]
    with torch.no_grad():
        logits = client.model(x)
        term = not_true_distillation(logits, server.global_model(x), y, tau)
        assert term > 0
        expected = F.cross_entropy(logits, y) + beta * term
        assert client.local_loss(x, y).item() == pytest.approx(expected.item(), rel=1e-5)


def test_lag_composes_with_fedntd(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedNTD+LAG", "-bt", "1", "-tau", "2", "--lag_top_k", "2")
    assert_lag_composes(server, k=2)


def test_short_runs_zero_beta_is_fedavg_and_distillation_changes_training(data_dir, tmp_path):
    def run(server):
        train(server)
        return read_results(results_file(server))[0]
    common = ("-gr", "1", "-jr", "0.5")
    fedavg = run(server_of_class(FedAvg, data_dir, tmp_path / "avg", "-algo", "FedAvg", *common, head_split=False))
    plain = run(server_for(data_dir, tmp_path / "zero", "-algo", "FedNTD", "-bt", "0", *common))
    ntd = run(server_for(data_dir, tmp_path / "ntd", "-algo", "FedNTD", "-bt", "1", "-tau", "2", *common))
    for name in ("rs_test_acc", "rs_test_auc", "rs_train_loss"):
        assert np.array_equal(plain[name], fedavg[name]), name
    assert np.isfinite(ntd["rs_train_loss"]).all() and len(ntd["rs_test_acc"]) == 2
    assert ntd["rs_train_loss"][1] != fedavg["rs_train_loss"][1]


def test_bad_beta_or_temperature_is_refused(data_dir, tmp_path):
    with pytest.raises(ConfigError, match="-tau"):
        server_for(data_dir, tmp_path, "-algo", "FedNTD", "-tau", "0")
    with pytest.raises(ConfigError, match="-bt"):
        server_for(data_dir, tmp_path, "-algo", "FedNTD", "-bt", "-1")
