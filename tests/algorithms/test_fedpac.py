"""FedPAC: the head-combination QP, the feature-alignment loss, the server step, FedPAC+LAG."""
import copy

import numpy as np
import pytest
import torch

from flcore.aggregation import named_tensors
from flcore.clients.clientpac import feature_alignment_loss, qp_statistics
from utils.errors import ConfigError
from flcore.servers.serverpac import head_combination_weights, simplex_qp
from utils.result_utils import read_results
from helpers import assert_lag_composes, in_use, server_for, state_equal, train, results_file


def part_of(client, part: str) -> dict:
    """The tensors of ``client.model.<part>``, named as in it (read without checking the client out)."""
    prefix = part + "."
    return {n[len(prefix):]: t for n, t in client.module_tensors().items() if n.startswith(prefix)}


def objective(p, a):
    return float(a @ p @ a)


def test_qp_two_clients_matches_the_closed_form():
    # Client 0's problem: v0 a^2 + (v1 + d)(1 - a)^2, minimised at a = (v1 + d) / (v0 + v1 + d).
    v0, v1 = 0.3, 0.5
    references = torch.tensor([[[0.0, 0.0]], [[0.6, 0.0]]])  # d = ||h0 - h1||^2 = 0.36
    weights = head_combination_weights([v0, v1], references)
    d = 0.36
    assert weights[0] == pytest.approx([(v1 + d) / (v0 + v1 + d), v0 / (v0 + v1 + d)], abs=1e-6)
    assert weights[1] == pytest.approx([v1 / (v0 + v1 + d), (v0 + d) / (v0 + v1 + d)], abs=1e-6)


def test_qp_identical_statistics_share_equally_and_an_exact_client_keeps_its_own_head():
    same = head_combination_weights([0.2, 0.2, 0.2, 0.2], torch.ones(4, 3, 5))
    assert np.allclose(same, 0.25, atol=1e-6)
    # Client 0's statistics have no variance: its own head is unbiased and exact, so alpha_0 = e_0.
    references = torch.randn(3, 4, 6, generator=torch.Generator().manual_seed(0))
    weights = head_combination_weights([0.0, 1.0, 1.0], references)
    assert np.array_equal(weights[0], [1.0, 0.0, 0.0])


def test_qp_weights_lie_on_the_simplex_and_beat_every_other_point():
    rng = np.random.default_rng(1)
    variances = rng.uniform(0.0, 2.0, 5)
    references = torch.tensor(rng.normal(size=(5, 3, 4)))
    weights = head_combination_weights(variances, references)
    assert np.all(weights >= 0) and np.allclose(weights.sum(1), 1.0)
    h = references.flatten(1).numpy()
    samples = rng.dirichlet(np.ones(5), size=2000)
    for i in range(5):
        p = np.diag(variances) + (h[i] - h) @ (h[i] - h).T
        best = min(objective(p, s) for s in np.vstack([samples, np.eye(5)]))
        assert objective(p, weights[i]) <= best * (1 + 1e-2) + 1e-9
    assert simplex_qp(np.full((2, 2), np.nan)) is None


def test_qp_statistics_are_the_variance_of_the_class_weighted_mean_estimate():
    g = torch.Generator().manual_seed(3)
    z = torch.randn(10, 4, generator=g, dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 2, 2, 2, 0, 1, 2, 2])
    onehot = torch.nn.functional.one_hot(y, 4).double()
    variance, reference = qp_statistics(onehot.sum(0), onehot.T @ z, onehot.T @ (z * z).sum(1))
    n, by_hand = len(y), 0.0
    for k in range(4):
        rows = z[y == k]
        if len(rows):
            p = len(rows) / n
            by_hand += p * (rows ** 2).sum(1).mean() - (p * rows.mean(0)).pow(2).sum()
            assert torch.allclose(reference[k].double(), p * rows.mean(0), atol=1e-6)
    assert variance == pytest.approx(float(by_hand / n))


def test_alignment_loss_against_a_hand_computation(data_dir, tmp_path):
    g = torch.Generator().manual_seed(4)
    features = torch.randn(5, 3, generator=g)
    labels = torch.tensor([0, 2, 1, 2, 0])
    prototypes = torch.randn(3, 3, generator=g)
    present = torch.tensor([True, False, True])
    total = sum(((features[i] - prototypes[labels[i]]) ** 2).sum() for i in range(5) if present[labels[i]])
    assert torch.allclose(feature_alignment_loss(features, labels, prototypes, present), total / 15)
    # The client's local objective is cross-entropy + lamda * that term on its own features.
    server = server_for(data_dir, tmp_path, "-algo", "FedPAC", "-lam", "0.7")
    client = in_use(server.clients[0])
    client.set_global_prototypes(torch.randn(4, 100, generator=g), torch.tensor([True, True, False, True]))
    x, y = client.train_data.x[:8], client.train_data.y[:8]
    z = client.model.base(x)
    hand = torch.nn.functional.cross_entropy(client.model.head(z), y) + 0.7 * sum(
        ((z[i] - client.global_prototypes[y[i]]) ** 2).sum() for i in range(8)
        if client.global_prototype_mask[y[i]]) / z.numel()
    assert torch.allclose(client.local_loss(x, y), hand)


def test_head_stage_trains_the_head_with_the_body_frozen(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedPAC", "-ls", "0")
    client = in_use(server.clients[0])
    before = copy.deepcopy(named_tensors(client.model))
    client.train()
    after = named_tensors(client.model)
    assert state_equal(after, before, [n for n in after if n.startswith("base.")])
    assert not state_equal(after, before, [n for n in after if n.startswith("head.")])


def test_server_pools_prototypes_combines_heads_and_averages_only_bodies(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedPAC", "-jr", "0.5")
    server.selected_clients = server.select_clients()
    server.send_models()
    server.train_clients(server.selected_clients)
    server.receive_models()
    heads = {c.id: copy.deepcopy(part_of(c, "head")) for c in server.clients}
    server.aggregate_parameters()
    uploaders = [c for c in server.clients if c.id in server.uploader_ids()]
    assert len(uploaders) == 3
    # Global prototypes: per class, sample-count-weighted mean of the uploaded prototypes.
    for k in range(server.num_classes):
        n = sum(float(c.prototype_counts[k]) for c in uploaders)
        assert bool(server.global_prototype_mask[k]) == (n > 0)
        if n:
            expected = sum(float(c.prototype_counts[k]) * c.prototypes[k] for c in uploaders) / n
            assert torch.allclose(server.global_prototypes[k], expected, atol=1e-5)
    # Heads: each uploader's is its QP row applied to the heads as they were uploaded.
    weights = server.head_weights
    recomputed = head_combination_weights([c.feature_variance for c in uploaders],
                                          torch.stack([c.class_reference for c in uploaders]))
    assert np.allclose(weights, recomputed) and np.allclose(weights.sum(1), 1.0)
    assert not np.allclose(weights, np.eye(3))  # the heads really were mixed
    for i, client in enumerate(uploaders):
        for name, value in part_of(client, "head").items():
            expected = sum(weights[i, j] * heads[other.id][name] for j, other in enumerate(uploaders))
            assert torch.allclose(value, expected, atol=1e-6), (client.id, name)
    for client in server.clients:
        if client.id not in server.uploader_ids():
            assert state_equal(part_of(client, "head"), heads[client.id])
    # Broadcast: every client gets the averaged body and the prototypes; heads stay put.
    heads = {c.id: copy.deepcopy(part_of(c, "head")) for c in server.clients}
    server.send_models()
    for client in server.clients:
        assert state_equal(part_of(client, "base"), named_tensors(server.global_model.base))
        assert state_equal(part_of(client, "head"), heads[client.id])
        assert torch.equal(client.global_prototypes, server.global_prototypes)


def test_fedpac_plus_lag_personalises_body_tensors_and_keeps_heads_local(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedPAC+LAG", "-m", "CNN", "-lbs", "32", "-jr", "0.5",
                        "--lag_top_k", "4")  # its head (2 tensors) counts towards K
    uploads = lambda c: {} if c.prototypes is None else {"prototypes": c.prototypes, "reference": c.class_reference}
    personal = assert_lag_composes(server, k=2, private=uploads)
    assert all(n.startswith("base.") for n in personal)


def test_negative_lamda_is_a_config_error(data_dir, tmp_path):
    with pytest.raises(ConfigError, match="-lam"):
        server_for(data_dir, tmp_path, "-algo", "FedPAC", "-lam", "-1")


def test_short_run_records_accuracy_and_the_weight_of_each_own_head(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedPAC", "-gr", "1", "-jr", "0.5")
    train(server)
    arrays, attrs = read_results(results_file(server))
    assert attrs["complete"] and len(arrays["rs_test_acc"]) == 2
    assert np.all(np.isfinite(arrays["rs_train_loss"]))
    own = arrays["rs_head_own_weight"]
    assert own.shape == (2, 6) and (np.isfinite(own).sum(axis=1) == 3).all()
    assert np.all((own[np.isfinite(own)] >= 0) & (own[np.isfinite(own)] <= 1))
    uploaders = [c.id for c in server.selected_clients]  # no -cdr: every selected client uploaded
    assert np.allclose(own[-1][uploaders], np.diag(server.head_weights))
