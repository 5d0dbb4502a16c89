"""APPLE: each client mixes every client's core model through a directed relationship vector it learns, pulled
towards the sample shares p0 with a cosine-faded weight; the server keeps and forwards the core models."""
import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from flcore.aggregation import named_tensors
from flcore.clients.clientapple import mixed_parameters
from flcore.servers.serverapple import faded_pull
from utils.result_utils import read_results
from helpers import assert_lag_composes, in_use, perturb_all_clients, play_round, results_file, server_for, train


def test_the_pull_fades_along_half_a_cosine():
    assert faded_pull(0.1, 0, 4) == pytest.approx(0.1)
    assert faded_pull(0.1, 1, 4) == pytest.approx(0.1 * (1 + math.sqrt(0.5)) / 2)
    assert faded_pull(0.1, 2, 4) == pytest.approx(0.05)
    assert faded_pull(0.1, 4, 4) == 0.0 and faded_pull(0.1, 9, 4) == 0.0
    assert faded_pull(0.1, 0, 0) == 0.0  # -L 0: no pull at all


def test_the_mixture_and_its_gradients_by_hand():
    generator = torch.Generator().manual_seed(0)
    cores = {"w": torch.randn(3, 2, 2, generator=generator)}  # three clients' core models
    own = {"w": torch.randn(2, 2, generator=generator, requires_grad=True)}
    p = torch.tensor([0.2, 0.5, 0.3], requires_grad=True)
    mixed = mixed_parameters(own, 1, p, cores)
    # Row 1 (this client's, as the server last saw it) is replaced by the live core model.
    expected = 0.2 * cores["w"][0] + 0.5 * own["w"].detach() + 0.3 * cores["w"][2]
    assert torch.allclose(mixed["w"], expected)
    direction = torch.randn(2, 2, generator=generator)
    (mixed["w"] * direction).sum().backward()
    # d/dp_j = <g, theta_j> (the paper's chain rule, not PFLlib's mean of products); d/dtheta_i = p_ii g.
    assert torch.allclose(p.grad, torch.stack([(direction * cores["w"][0]).sum(), (direction * own["w"]).sum(),
                                               (direction * cores["w"][2]).sum()]).detach())
    assert torch.allclose(own["w"].grad, 0.5 * direction)
    # An unmixed tensor (X+LAG's) is the client's own, with its gradient scaled by 1/N.
    own["w"].grad = None
    kept = mixed_parameters(own, 1, p, cores, unmixed={"w"})["w"]
    assert torch.equal(kept, own["w"])
    (kept * direction).sum().backward()
    assert torch.allclose(own["w"].grad, direction / 3)


def test_one_step_moves_the_core_model_and_the_relationships_as_the_paper_says(data_dir, tmp_path):
    """The defining step: p_i learns from <grad CE(theta_hat), theta_j> and its faded pull towards p0, and
    theta_i moves by lr * N * p_ii * grad CE(theta_hat)."""
    lr, dlr, mu = 0.05, 0.01, 0.4
    server = server_for(data_dir, tmp_path, "-algo", "APPLE", "-jr", "0.5", "-dlr", str(dlr), "-mu", str(mu),
                        "-L", "1", "-gr", "4")
    play_round(server)  # some core models trained and stored
    server.current_round = 1
    server.selected_clients = server.select_clients()
    server.send_models()
    client = in_use(server.selected_clients[0])
    n = len(server.clients)
    with torch.no_grad():
        client.relationships.p.add_(0.01 * torch.arange(n, dtype=torch.float32))  # away from p0
    weight = mu * (1 + math.cos(math.pi / 4)) / 2
    assert client.pull_weight == pytest.approx(weight)
    cores = server.known_models()
    own = {k: v.detach().clone() for k, v in client.model.named_parameters()}
    p, p0 = client.relationships.p.detach().clone(), client.initial_relationships
    x, y = client.train_data.x[:10], client.train_data.y[:10]
    # theta_hat by hand, and the gradient of CE there.
    theta_hat = {k: sum(float(p[j]) * (own[k] if j == client.id else cores[j][k]) for j in range(n)) for k in own}
    probe = {k: v.clone().requires_grad_(True) for k, v in theta_hat.items()}
    ce = F.cross_entropy(functional_call(client.model, probe, (x,)), y)
    g = dict(zip(probe, torch.autograd.grad(ce, list(probe.values()))))

    client.optimizer.zero_grad()
    client.local_loss(x, y).backward()
    client.optimizer.step()

    for k in own:
        expected = own[k] - lr * n * float(p[client.id]) * g[k]
        assert torch.allclose(client.model.state_dict()[k], expected, atol=1e-5), k
    inner = torch.tensor([sum(float((g[k] * (own[k] if j == client.id else cores[j][k])).sum()) for k in own)
                          for j in range(n)])
    expected_p = p - dlr * (inner + weight * (p - p0))
    assert torch.allclose(client.relationships.p.detach(), expected_p, atol=1e-5)


def test_the_server_forwards_every_core_model_and_averages_none(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "APPLE", "-jr", "0.5")
    samples = [c.train_samples for c in server.clients]
    p0 = torch.tensor(samples, dtype=torch.float32) / sum(samples)
    assert all(torch.allclose(c.module_tensors("relationships")["p"], p0) for c in server.clients)
    initial = copy.deepcopy(named_tensors(server.global_model))
    play_round(server)
    uploaded = {u.client_id for u in server.uploads}
    assert uploaded
    for client in server.clients:
        stored = server.latest_models[client.id]
        assert (stored is None) == (client.id not in uploaded)
        if stored is not None:
            assert all(torch.equal(t, client.module_tensors()[k]) for k, t in stored.items())
        # The personalised model (reported) is sum_j p_ij theta_j, formed after training; untrained: the initial.
        if client.id not in uploaded:
            assert all(torch.equal(t, initial[k]) for k, t in client.module_tensors("personalised_model").items())
    assert all(torch.equal(t, initial[k]) for k, t in named_tensors(server.global_model).items())
    # The next round's downloads: row j is client j's last upload, or the initial model.
    perturb_all_clients(server)
    server.selected_clients = server.select_clients()
    server.send_models()
    for client in server.selected_clients:
        for name, stack in client.core_models.items():
            for j in range(len(server.clients)):
                expected = server.latest_models[j][name] if j in uploaded else initial[name]
                assert torch.equal(stack[j], expected), (name, j)


def test_apple_plus_lag_does_not_mix_the_personal_layers(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "APPLE+LAG", "--lag_top_k", "2")
    personal = assert_lag_composes(server, k=2)
    for client in server.selected_clients:
        assert client.unmixed == personal
        mixed = client.personalised_parameters()
        own = dict(client.model.named_parameters())
        assert all(torch.equal(mixed[n], own[n]) for n in personal)


def test_relationships_are_recorded_and_a_newcomer_starts_from_the_p0_mix(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "APPLE", "-nc", "4", "-nnc", "1", "-ften", "0", "-gr", "1")
    train(server)
    arrays, _ = read_results(results_file(server))
    assert arrays["apple_relationships"].shape == (2, 4, 4)
    newcomer = in_use(server.new_clients[0])
    p0 = server.initial_relationships
    cores = server.known_models()
    assert sum(m is not None for m in server.latest_models) >= 2
    for name, value in newcomer.personalised_model.named_parameters():
        assert torch.allclose(value, sum(float(p0[j]) * cores[j][name] for j in range(4)), atol=1e-6), name
        assert torch.equal(value, dict(newcomer.model.named_parameters())[name])
    assert not np.allclose(arrays["apple_relationships"][-1], p0.numpy())  # the trained clients' p moved
