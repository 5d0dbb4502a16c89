"""FedCP: a conditional policy splits features between a personal and a frozen global head."""
import copy
import math

import numpy as np
import pytest
import torch

from flcore.aggregation import named_tensors, sample_weights
from utils.errors import ConfigError
from flcore.trainmodel.fedcp_model import gumbel_noise, rbf_mmd
from utils.result_utils import read_results
from helpers import assert_lag_composes, in_use, play_round, server_for, state_equal, train, results_file


def test_rbf_mmd_matches_a_hand_computation():
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(4, 3, generator=generator), 2 + torch.randn(4, 3, generator=generator)

    def k(a, b):
        d2 = float(((a - b) ** 2).sum())
        return sum(math.exp(-d2 / (2 * bandwidth)) for bandwidth in (10, 15, 20, 50))
    # The authors' biased estimator: every entry of the three Gram matrices, diagonals included.
    expected = (np.mean([k(a, b) for a in x for b in x]) + np.mean([k(a, b) for a in y for b in y])
                - 2 * np.mean([k(a, b) for a in x for b in y]))
    assert expected > 0
    assert math.isclose(float(rbf_mmd(x, y)), expected, rel_tol=1e-5)
    assert float(rbf_mmd(x, x)) == pytest.approx(0.0, abs=1e-6)


def test_policy_splits_each_feature_between_the_two_heads(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedCP")
    model = in_use(server.clients[2]).model.eval()
    x = server.clients[2].test_data.x
    with torch.no_grad():
        model.global_head.weight.add_(0.3)  # make the two heads differ
        z = model.base(x)
        context = model.head.weight.sum(0) / model.head.weight.sum(0).norm()
        scores = model.policy.scores(z * context).view(len(x), 2, -1)
        personal = scores.exp()[:, 0] / scores.exp().sum(1)
        expected = model.head(z * personal) + model.global_head(z * (1 - personal))
        assert torch.allclose(model(x), expected, atol=1e-5)
        # With Gumbel noise (training) the shares still sum to one per feature.
        noise = gumbel_noise((len(x), 2, z.shape[1]), torch.Generator().manual_seed(0), z.device)
        r, s = model.policy(z * context, noise)
        assert torch.allclose(r + s, torch.ones_like(r)) and not torch.allclose(r, personal)


def test_local_loss_adds_lambda_times_mmd_to_the_received_base(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedCP", "-lam", "2.0")
    client = in_use(server.clients[0])
    client.begin_local_training()
    received = copy.deepcopy(client.model.base)
    with torch.no_grad():  # as if some steps were taken: the base moves, the reference must not
        for param in client.model.base.parameters():
            param.add_(0.05)
    x, y = client.train_data.x[:10], client.train_data.y[:10]
    state = client.generator.get_state()
    loss = client.local_loss(x, y)
    client.generator.set_state(state)
    with torch.no_grad():
        z = client.model.base(x)
        noise = gumbel_noise((len(x), 2, z.shape[1]), client.generator, z.device)
        logits, _ = client.model.predict(z, client.model.context(), noise)
        mmd = rbf_mmd(z, received(x))
        expected = torch.nn.functional.cross_entropy(logits, y) + 2.0 * mmd
    assert float(mmd) > 0
    assert torch.allclose(loss, expected, atol=1e-5)


def test_global_head_is_frozen_and_uploaded_as_the_mean_of_both_heads(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedCP", "-jr", "0.5")
    server.selected_clients = server.select_clients()
    server.send_models()
    received = copy.deepcopy(named_tensors(server.global_model.global_head))
    heads = {c.id: copy.deepcopy(named_tensors(in_use(c).model.head)) for c in server.clients}
    server.train_clients(server.selected_clients)
    for client in server.selected_clients:
        client.check_out()
        head = named_tensors(client.model.head)
        assert not state_equal(head, heads[client.id])
        for name, value in named_tensors(client.model.global_head).items():
            assert torch.allclose(value, 0.5 * head[name] + 0.5 * received[name], atol=1e-7), name
    server.receive_models()
    server.aggregate_parameters()
    weights = sample_weights([c.train_samples for c in server.selected_clients])
    for name, value in named_tensors(server.global_model.global_head).items():
        expected = sum(w * named_tensors(in_use(c).model.global_head)[name] for w, c in zip(weights, server.selected_clients))
        assert torch.allclose(value, expected, atol=1e-6)

    trained_heads = {c.id: copy.deepcopy(named_tensors(in_use(c).model.head)) for c in server.clients}
    server.send_models()
    global_state = named_tensors(server.global_model)
    shared = [n for n in global_state if not n.startswith("head.")]
    for client in server.clients:
        client.check_out()
        assert state_equal(named_tensors(client.model), global_state, shared)
        assert state_equal(named_tensors(client.model.head), trained_heads[client.id])


def test_training_does_not_depend_on_client_order_or_the_global_generator(data_dir, tmp_path):
    first = server_for(data_dir, tmp_path, "-algo", "FedCP")
    play_round(first)
    second = server_for(data_dir, tmp_path, "-algo", "FedCP")
    second.selected_clients = second.select_clients()
    second.send_models()
    updates = {}
    for client in reversed(second.selected_clients):
        torch.rand(3)
        updates[client.id] = in_use(client).train()
    second.trained_updates = {c.id: updates[c.id] for c in second.selected_clients}
    second.receive_models()
    second.aggregate_parameters()
    assert state_equal(named_tensors(first.global_model), named_tensors(second.global_model))
    for a, b in zip(first.clients, second.clients):
        assert state_equal(a.module_tensors(), b.module_tensors())


def test_negative_lambda_is_refused(data_dir, tmp_path):
    with pytest.raises(ConfigError, match="-lam"):
        server_for(data_dir, tmp_path, "-algo", "FedCP", "-lam", "-0.5")


def test_fedcp_plus_lag_ranks_shared_parts_and_keeps_the_personal_head(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedCP+LAG", "--lag_top_k", "5")  # + its head
    assert_lag_composes(server, k=3)
    candidates = {n for layer in server.lag_layers for n in layer.tensors}
    assert {n.split(".")[0] for n in candidates} == {"base", "global_head", "policy"}


def test_end_to_end_records_the_personal_share(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedCP", "-gr", "1", "-lam", "5")
    train(server)
    arrays, attrs = read_results(results_file(server))
    assert attrs["complete"] and len(arrays["rs_test_acc"]) == 2
    assert np.isfinite(arrays["rs_train_loss"]).all()
    assert arrays["rs_test_acc"][-1] > arrays["rs_test_acc"][0]
    share = arrays["rs_personal_share"]
    assert len(share) == 2 and ((0 < share) & (share < 1)).all()
