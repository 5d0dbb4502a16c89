"""FedProto: class prototypes up, unweighted per-class means down, nearest-prototype inference."""
import pytest
import torch
import torch.nn.functional as F

from flcore.clients.clientproto import prototype_distances
from flcore.registry import UnknownAlgorithmError, resolve
from flcore.training.classvectors import ClassMeanAccumulator, ClassVectors, average_over_holders
from utils.result_utils import read_results
from helpers import in_use, results_file, server_for, train


def class_means(vectors: torch.Tensor, labels: torch.Tensor, num_classes: int) -> ClassVectors:
    """Mean of the rows of ``vectors`` (N, D) for each label in ``labels`` (N,), in one accumulation."""
    accumulator = ClassMeanAccumulator(num_classes)
    accumulator.add(vectors, labels)
    return accumulator.means(vectors.dtype)


def test_fedproto_plus_lag_is_refused_because_nothing_is_shared():
    with pytest.raises(UnknownAlgorithmError, match="prototypes"):
        resolve("FedProto+LAG")


def test_each_class_is_averaged_over_the_clients_that_hold_it_every_client_counting_once():
    # Client a holds classes 0 and 1 (from many samples), client b holds 1 and 2 (from few).
    a = class_means(torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 4.0]]), torch.tensor([0, 0, 1]), 4)
    b = class_means(torch.tensor([[0.0, 2.0], [6.0, 6.0]]), torch.tensor([1, 2]), 4)
    assert torch.equal(a.vectors, torch.tensor([[2.0, 0.0], [0.0, 4.0], [0.0, 0.0], [0.0, 0.0]]))
    assert a.present.tolist() == [True, True, False, False]
    pooled = average_over_holders([a, b])
    expected = torch.tensor([[2.0, 0.0], [0.0, 3.0], [6.0, 6.0], [0.0, 0.0]])
    assert torch.allclose(pooled.vectors, expected) and pooled.present.tolist() == [True, True, True, False]


def test_uploads_are_class_mean_features_and_the_server_pools_them_unweighted(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedProto", "-jr", "0.5")
    server.selected_clients = server.select_clients()
    server.send_models()
    server.train_clients(server.selected_clients)
    server.receive_models()
    assert all(u.extras["class_vectors"] is v for u, v in zip(server.uploads, server.uploaded_vectors))
    for client, upload in zip(server.selected_clients, server.uploaded_vectors):
        model = in_use(client).model
        with torch.no_grad():
            model.eval()
            features = model.base(client.train_data.x)
        for k in range(client.num_classes):
            rows = features[client.train_data.y == k]
            assert bool(upload.present[k]) == (len(rows) > 0)
            if len(rows):
                assert torch.allclose(upload.vectors[k], rows.mean(0), atol=1e-5)
    server.aggregate_parameters()
    for k in range(server.num_classes):
        holders = [u.vectors[k] for u in server.uploaded_vectors if u.present[k]]
        assert bool(server.global_present[k]) == bool(holders)
        if holders:
            assert torch.allclose(server.global_vectors[k], torch.stack(holders).mean(0), atol=1e-6)
    server.send_models()  # every client, selected or not, now holds the pooled prototypes
    for client in server.clients:
        assert torch.equal(client.global_prototypes.vectors, server.global_vectors)


def test_inference_is_the_nearest_global_prototype_and_absent_classes_are_never_predicted(data_dir, tmp_path):
    features = torch.tensor([[0.0, 0.0], [2.9, 3.0], [10.0, 10.0], [0.9, 1.2]])
    prototypes = ClassVectors(torch.tensor([[0.0, 0.0], [3.0, 3.0], [10.0, 10.0], [1.0, 1.0]]),
                              torch.tensor([True, True, False, True]))
    distances = prototype_distances(features, prototypes)
    assert torch.allclose(distances[1, :2], torch.tensor([2.9 ** 2 + 9.0, 0.01]))
    assert torch.isinf(distances[:, 2]).all()
    assert distances.argmin(dim=1).tolist() == [0, 1, 1, 3]  # (10, 10) goes to the nearest present class

    server = server_for(data_dir, tmp_path, "-algo", "FedProto")
    client = in_use(server.clients[0])
    assert client.test_metrics().correct == 0  # round 0: no prototype, no prediction
    with torch.no_grad():
        client.model.eval()
        test_features = client.model.base(client.test_data.x)
    # Prototypes built by hand from the test features: predictions follow the distances, not the head.
    client.receive_class_vectors(class_means(test_features, client.test_data.y, client.num_classes))
    d = torch.cdist(test_features, client.global_prototypes.vectors) ** 2
    d[:, ~client.global_prototypes.present] = float("inf")
    expected = int((d.argmin(dim=1) == client.test_data.y).sum())
    with torch.no_grad():  # a head that always answers class 0 must change nothing
        client.model.head.weight.zero_()
        client.model.head.bias.copy_(torch.arange(client.num_classes, 0, -1, dtype=torch.float32))
    stats = client.test_metrics()
    assert stats.correct == expected and stats.num_samples == len(client.test_data)
    assert expected > int((client.test_data.y == 0).sum())


def test_local_loss_is_cross_entropy_plus_lamda_times_mse_to_the_label_prototype(data_dir, tmp_path):
    lamda = 0.7
    server = server_for(data_dir, tmp_path, "-algo", "FedProto", "-lam", str(lamda))
    client = in_use(server.clients[2])
    x, y = client.train_data.x[:12], client.train_data.y[:12]
    width = client.model.head.in_features
    present = torch.ones(client.num_classes, dtype=torch.bool)
    present[int(y[0])] = False  # rows of this class get no prototype term
    prototypes = ClassVectors(torch.randn(client.num_classes, width, generator=torch.Generator().manual_seed(1)),
                              present)
    client.receive_class_vectors(prototypes)
    features = client.model.base(x)
    ce = F.cross_entropy(client.model.head(features), y)
    squared = ((features - prototypes.vectors[y]) ** 2) * present[y].unsqueeze(1)
    expected = ce + lamda * squared.sum() / features.numel()
    assert torch.allclose(client.local_loss(x, y), expected, atol=1e-6)


def test_two_rounds_end_to_end(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedProto", "-gr", "1")
    train(server)
    arrays, _ = read_results(results_file(server))
    acc, loss = arrays["rs_test_acc"], arrays["rs_train_loss"]
    assert len(acc) == 2 and acc[0] == 0.0  # no prototype before the first aggregation
    assert acc[1] > 0.5 and all(torch.isfinite(torch.as_tensor(loss)))  # 4 classes: chance is 0.25
    assert bool(server.global_present.all())
