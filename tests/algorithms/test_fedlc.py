"""FedLC: calibration offsets from the client's own counts, absent classes, the loss by hand, X+LAG, a run."""
import math
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from flcore.clients.clientlc import calibration_offsets
from utils.errors import ConfigError
from utils.result_utils import read_results
from helpers import assert_lag_composes, in_use, server_for, train, results_file


def test_offsets_are_tau_times_count_to_the_minus_quarter_and_infinite_for_absent_classes():
    offsets = calibration_offsets(torch.tensor([16, 1, 0, 81]), tau=2.0)
    assert offsets.tolist() == pytest.approx([1.0, 2.0, math.inf, 2.0 / 3.0])
    assert torch.equal(calibration_offsets(torch.tensor([5, 0]), tau=0.0), torch.zeros(2))


def test_calibrated_loss_matches_a_hand_computation_with_classes_the_client_never_saw(data_dir, tmp_path):
    tau = 2.0
    # Six outputs for four-class data: classes 4 and 5 are absent on every client.
    server = server_for(data_dir, tmp_path, "-algo", "FedLC", "-tau", str(tau), "-ncl", "6")
    client = in_use(server.clients[0])
    counts = Counter(client.train_data.y.tolist())
    assert client.class_counts.tolist() == [counts.get(c, 0) for c in range(6)]
    x, y = client.train_data.x[:5], client.train_data.y[:5]
    with torch.no_grad():
        logits = client.model(x).tolist()
    expected = 0.0
    for row, label in zip(logits, y.tolist()):
        calibrated = {c: row[c] - tau * counts[c] ** -0.25 for c in range(6) if counts.get(c, 0) > 0}
        expected += -math.log(math.exp(calibrated[label]) / sum(math.exp(v) for v in calibrated.values()))
    loss = client.local_loss(x, y)
    assert loss.item() == pytest.approx(expected / len(logits), rel=1e-5)
    client.model.zero_grad()
    loss.backward()
    head = client.model.head
    assert all(torch.isfinite(p.grad).all() for p in client.model.parameters())
    assert head.weight.grad[4:].abs().max() == 0 and head.bias.grad[4:].abs().max() == 0
    assert head.weight.grad[:4].abs().max() > 0


def test_zero_tau_is_plain_cross_entropy(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedLC", "-tau", "0", "-ncl", "6")
    client = in_use(server.clients[1])
    x, y = client.train_data.x[:10], client.train_data.y[:10]
    with torch.no_grad():
        assert torch.equal(client.local_loss(x, y), F.cross_entropy(client.model(x), y))


def test_lag_composes_with_fedlc(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedLC+LAG", "-tau", "1", "--lag_top_k", "2")
    assert_lag_composes(server, k=2)


def test_short_runs_zero_tau_is_fedavg_and_calibration_trains_with_absent_classes(data_dir, tmp_path):
    def run(folder, *flags):
        server = server_for(data_dir, tmp_path / folder, *flags, "-gr", "2", "-ncl", "6")
        train(server)
        return read_results(results_file(server))[0]
    fedavg = run("avg", "-algo", "FedAvg")
    plain = run("zero", "-algo", "FedLC", "-tau", "0")
    calibrated = run("lc", "-algo", "FedLC", "-tau", "1")
    for name in ("rs_test_acc", "rs_test_auc", "rs_train_loss"):
        assert np.array_equal(plain[name], fedavg[name]), name
    assert np.isfinite(calibrated["rs_train_loss"]).all() and len(calibrated["rs_test_acc"]) == 3
    assert calibrated["rs_test_acc"][-1] > calibrated["rs_test_acc"][0]
    assert calibrated["rs_train_loss"][1] != fedavg["rs_train_loss"][1]


def test_negative_tau_is_refused(data_dir, tmp_path):
    with pytest.raises(ConfigError, match="-tau"):
        server_for(data_dir, tmp_path, "-algo", "FedLC", "-tau", "-1")
