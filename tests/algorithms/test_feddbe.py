"""FedDBE: a personal feature bias before the head, and a running feature mean pulled to a global one."""
import numpy as np
import pytest
import torch

from flcore.aggregation import named_tensors, sample_weights
from utils.errors import ConfigError
from utils.result_utils import read_results
from utils.seeding import client_generator
from helpers import assert_lag_composes, in_use, original_and_restored_twin, play_round, server_for, state_equal, train, results_file


def test_bias_is_personal_and_enters_the_prediction(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedDBE", "-jr", "0.5")
    play_round(server)
    trained = {c.id for c in server.selected_clients}
    bias_storage = {c.module_tensors("feature_bias")["bias"].data_ptr() for c in server.clients}
    for client in server.clients:
        client.check_out()
        assert bool(client.feature_bias.bias.abs().sum() > 0) == (client.id in trained), client.id
        assert id(client.feature_bias.bias) not in {id(p) for p in client.model.parameters()}
    for upload in server.uploads:
        assert not bias_storage & {t.data_ptr() for t in upload.tensors.values()}

    kept = {c.id: c.feature_bias.bias.detach().clone() for c in server.clients}
    server.send_models()
    for client in server.clients:
        assert torch.equal(client.feature_bias.bias, kept[client.id])
        assert torch.equal(client.global_mean, server.global_feature_mean)
    client = server.clients[sorted(trained)[0]]
    x = client.test_data.x
    with torch.no_grad():
        biased = client.model.head(client.model.base(x) + client.feature_bias.bias)
        assert torch.allclose(client.evaluation_model()(x), biased)
        assert not torch.allclose(client.model(x), biased)


def test_mean_regulariser_matches_a_hand_computation(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedDBE", "-mo", "0.3", "-klw", "2.0")
    client = in_use(server.clients[0])
    x, y = client.train_data.x[:12], client.train_data.y[:12]
    dim = client.feature_bias.bias.shape[0]
    generator = torch.Generator().manual_seed(1)
    client.global_mean = torch.randn(dim, generator=generator)
    previous = torch.randn(dim, generator=generator)
    with torch.no_grad():
        client.feature_bias.bias.copy_(torch.randn(dim, generator=generator))
    client.running_mean = previous.clone()
    loss = client.local_loss(x, y)
    with torch.no_grad():
        features = client.model.base(x)
        running = 0.7 * previous + 0.3 * features.mean(0)
        ce = torch.nn.functional.cross_entropy(client.model.head(features + client.feature_bias.bias), y)
        expected = ce + 2.0 * (0.5 * (running - client.global_mean) ** 2).mean()
    assert torch.allclose(loss, expected, atol=1e-6)
    assert torch.allclose(client.running_mean, running, atol=1e-6) and not client.running_mean.requires_grad
    # The regulariser reaches the base through this batch's feature mean.
    client.model.zero_grad()
    (loss - ce).backward()
    assert client.model.base.fc1[0].weight.grad.abs().sum() > 0


def test_global_mean_is_deterministic_order_free_and_sample_weighted(data_dir, tmp_path):
    first = server_for(data_dir, tmp_path, "-algo", "FedDBE")
    second = server_for(data_dir, tmp_path, "-algo", "FedDBE")
    assert torch.equal(first.global_feature_mean, second.global_feature_mean)
    # The warm-up leaves every client's model as it was built: the initial global model.
    for client in second.clients:
        assert state_equal(client.module_tensors(), named_tensors(second.global_model))
    # Recomputed in reverse client order, from fresh generators, with the global RNG disturbed.
    means = {}
    for client in reversed(second.clients):
        client.generator = client_generator(second.config.seed, client.id)
        torch.rand(5)
        means[client.id] = client.initial_feature_mean(second.global_model)
    weights = sample_weights([c.train_samples for c in second.clients])
    expected = sum(w * means[c.id] for w, c in zip(weights, second.clients))
    assert torch.allclose(first.global_feature_mean, expected, atol=1e-6)


@pytest.mark.parametrize("flags", [("-mo", "1.5"), ("-klw", "-1")])
def test_out_of_range_flags_are_refused(data_dir, tmp_path, flags):
    with pytest.raises(ConfigError, match=flags[0]):
        server_for(data_dir, tmp_path, "-algo", "FedDBE", *flags)


def test_feddbe_plus_lag_keeps_the_feature_bias_private(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedDBE+LAG", "-klw", "1.0")
    assert_lag_composes(server, k=1, private=lambda c: named_tensors(c.feature_bias))


def test_a_loaded_state_continues_like_the_original(data_dir, tmp_path):
    original, twin = original_and_restored_twin(data_dir, tmp_path, "-algo", "FedDBE", "-jr", "0.5", "-klw", "1.0")
    for a, b in zip(original.clients, twin.clients):
        assert torch.equal(a.module_tensors("feature_bias")["bias"], b.module_tensors("feature_bias")["bias"])
        assert state_equal(a.module_tensors(), b.module_tensors())


def test_end_to_end_with_the_regulariser(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedDBE", "-gr", "1", "-klw", "1.0", "-mo", "0.5")
    train(server)
    arrays, attrs = read_results(results_file(server))
    assert attrs["complete"] and len(arrays["rs_test_acc"]) == 2
    assert np.isfinite(arrays["rs_train_loss"]).all()
    assert arrays["rs_test_acc"][-1] > arrays["rs_test_acc"][0]
    assert all(c.module_tensors("feature_bias")["bias"].abs().sum() > 0 for c in server.clients)
