"""FedGH: prototypes up, a server-trained global head down, bodies never averaged; FedGH+LAG refused."""
import copy

import numpy as np
import pytest
import torch

from flcore.aggregation import named_tensors
from flcore.registry import UnknownAlgorithmError, resolve
from utils.errors import ConfigError
from flcore.servers.servergh import prototype_examples
from flcore.training.classfeatures import class_feature_stats, pooled_prototypes
from utils.result_utils import read_results
from helpers import in_use, perturb_all_clients, server_for, state_equal, train, results_file


def test_fedgh_plus_lag_is_refused_because_fedgh_uploads_prototypes():
    with pytest.raises(UnknownAlgorithmError, match="prototypes"):
        resolve("FedGH+LAG")


def test_class_feature_stats_are_per_class_sums_counts_and_means(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedGH")
    client = in_use(server.clients[1])
    stats = class_feature_stats(client.model.base, client.train_data, client.num_classes, batch_size=7)
    with torch.no_grad():
        features = client.model.base(client.train_data.x).double()
    for k in range(client.num_classes):
        rows = features[client.train_data.y == k]
        assert stats.counts[k] == len(rows)
        assert torch.allclose(stats.sums[k], rows.sum(0))
        assert torch.allclose(stats.sq_norm_sums[k], (rows ** 2).sum())
        expected = rows.mean(0).float() if len(rows) else torch.zeros(features.shape[1])
        assert torch.allclose(stats.means()[k], expected, atol=1e-6)
    # Pooling two clients is the count-weighted mean, class by class.
    means = [torch.tensor([[1.0, 1.0], [0.0, 0.0]]), torch.tensor([[4.0, 7.0], [2.0, 2.0]])]
    counts = [torch.tensor([1.0, 0.0]), torch.tensor([2.0, 3.0])]
    pooled, present = pooled_prototypes(means, counts)
    assert torch.allclose(pooled, torch.tensor([[3.0, 5.0], [2.0, 2.0]])) and present.tolist() == [True, True]


def test_server_trains_the_head_on_prototypes_only_and_every_client_receives_exactly_it(data_dir, tmp_path):
    lr = 0.5
    server = server_for(data_dir, tmp_path, "-algo", "FedGH", "-lbs", "32", "-slr", str(lr))
    initial_base = copy.deepcopy(named_tensors(server.global_model.base))
    server.selected_clients = server.select_clients()
    server.send_models()
    server.train_clients(server.selected_clients)
    server.receive_models()
    assert [u.client_id for u in server.uploads] == [c.id for c in server.selected_clients]
    # The uploads are each client's class means under its trained body.
    for client, (prototypes, counts) in zip(server.selected_clients, server.uploaded_prototypes):
        with torch.no_grad():
            features = in_use(client).model.base(client.train_data.x)
        for k in range(client.num_classes):
            rows = features[client.train_data.y == k]
            assert counts[k] == len(rows)
            if len(rows):
                assert torch.allclose(prototypes[k], rows.mean(0), atol=1e-5)
    # By hand: one full-batch SGD step on cross-entropy over the (prototype, class) pairs (24 <= -lbs).
    features, labels = prototype_examples(server.uploaded_prototypes)
    assert 0 < len(labels) <= 32
    head = copy.deepcopy(server.global_model.head)
    loss = torch.nn.functional.cross_entropy(head(features), labels)
    grads = torch.autograd.grad(loss, list(head.parameters()))
    expected = {n: p.detach() - lr * g for (n, p), g in zip(head.named_parameters(), grads)}
    # Client parameters must play no part: scramble them before the server step.
    perturb_all_clients(server)
    bodies = {c.id: copy.deepcopy(named_tensors(c.model.base)) for c in server.clients}
    server.aggregate_parameters()
    for name, value in named_tensors(server.global_model.head).items():
        assert torch.allclose(value, expected[name], atol=1e-6), name
    assert state_equal(named_tensors(server.global_model.base), initial_base)
    server.send_models()
    global_head = named_tensors(server.global_model.head)
    for client in server.clients:
        assert state_equal(named_tensors(client.model.head), global_head), f"client {client.id} head"
        assert state_equal(named_tensors(client.model.base), bodies[client.id]), f"client {client.id} body"
    first = named_tensors(server.clients[0].model.base)
    assert all(not state_equal(named_tensors(c.model.base), first) for c in server.clients[1:])


def test_non_positive_server_learning_rate_is_a_config_error(data_dir, tmp_path):
    with pytest.raises(ConfigError, match="-slr"):
        server_for(data_dir, tmp_path, "-algo", "FedGH", "-slr", "0")


def test_short_run_records_accuracy_and_the_server_head_loss(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedGH", "-gr", "1", "-slr", "0.1")
    train(server)
    arrays, attrs = read_results(results_file(server))
    assert attrs["complete"]
    assert len(arrays["rs_test_acc"]) == 2 and np.all((arrays["rs_test_acc"] >= 0) & (arrays["rs_test_acc"] <= 1))
    assert np.all(np.isfinite(arrays["rs_train_loss"]))
    assert arrays["rs_server_head_loss"].shape == (2,) and np.all(np.isfinite(arrays["rs_server_head_loss"]))
