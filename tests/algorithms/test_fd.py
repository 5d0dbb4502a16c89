"""FD: per-class mean logits collected during training, pooled per class, distilled back."""
import pytest
import torch
import torch.nn.functional as F

from flcore.registry import UnknownAlgorithmError, resolve
from flcore.training.classvectors import ClassVectors
from utils.result_utils import read_results
from helpers import in_use, server_for, train, results_file


def test_fd_plus_lag_is_refused_because_nothing_is_shared():
    with pytest.raises(UnknownAlgorithmError, match="logits"):
        resolve("FD+LAG")


def test_uploads_are_per_class_means_of_the_training_logits_and_the_server_pools_them_unweighted(data_dir, tmp_path):
    # A learning rate this small leaves the model as it was, so the logits seen during training are
    # those of the initial model on exactly the samples the training batches visited.
    server = server_for(data_dir, tmp_path, "-algo", "FD", "-jr", "0.5", "-lr", "1e-12", "-lbs", "8", "-lam", "0")
    server.selected_clients = server.select_clients()
    server.send_models()
    visited = {}
    for client in server.selected_clients:
        replay = torch.Generator().set_state(client.generator.get_state())
        batches = list(client.train_data.train_batches(client.batch_size, replay))
        x = torch.cat([b[0] for b in batches])
        with torch.no_grad():
            visited[client.id] = (in_use(client).model(x), torch.cat([b[1] for b in batches]))
    assert any(len(v[1]) < len(c.train_data) for c, v in zip(server.selected_clients, visited.values()))
    server.train_clients(server.selected_clients)
    server.receive_models()
    assert all(u.extras["class_vectors"] is v for u, v in zip(server.uploads, server.uploaded_vectors))
    for client, upload in zip(server.selected_clients, server.uploaded_vectors):
        logits, labels = visited[client.id]
        for k in range(client.num_classes):
            rows = logits[labels == k]
            assert bool(upload.present[k]) == (len(rows) > 0)
            if len(rows):
                assert torch.allclose(upload.vectors[k], rows.mean(0), atol=1e-5)
    server.aggregate_parameters()
    for k in range(server.num_classes):
        holders = [u.vectors[k] for u in server.uploaded_vectors if u.present[k]]
        assert bool(server.global_present[k]) == bool(holders)
        if holders:
            assert torch.allclose(server.global_vectors[k], torch.stack(holders).mean(0), atol=1e-6)


def test_local_loss_adds_lamda_times_kl_to_the_global_logit_of_the_label(data_dir, tmp_path):
    lamda = 0.3
    server = server_for(data_dir, tmp_path, "-algo", "FD", "-lam", str(lamda))
    client = server.clients[1]
    x, y = client.train_data.x[:10], client.train_data.y[:10]
    present = torch.ones(client.num_classes, dtype=torch.bool)
    present[int(y[0])] = False  # rows of this label get no teacher
    teacher = torch.randn(client.num_classes, client.num_classes, generator=torch.Generator().manual_seed(3))
    client.receive_class_vectors(ClassVectors(teacher, present))
    in_use(client).begin_local_training()
    logits = client.model(x)
    target = torch.softmax(teacher[y], dim=1)
    kl = (target * (target.log() - torch.log_softmax(logits, dim=1))).sum(dim=1) * present[y]
    expected = F.cross_entropy(logits, y) + lamda * kl.mean()
    assert torch.allclose(client.local_loss(x, y), expected, atol=1e-6)


def test_two_rounds_end_to_end(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FD", "-gr", "1", "-lam", "0.5")
    train(server)
    arrays, _ = read_results(results_file(server))
    assert len(arrays["rs_test_acc"]) == 2 and arrays["rs_test_acc"][1] > 0.5  # 4 classes: chance is 0.25
    assert all(torch.isfinite(torch.as_tensor(arrays["rs_train_loss"])))
    assert bool(server.global_present.all()) and server.global_vectors.shape == (4, 4)
