"""FedMTL: each client a task with its own model, coupled through lamda/2 tr(W Omega W^T) (mean-regularised
Omega), the server keeping every task's latest model."""
import copy

import pytest
import torch

from flcore.aggregation import named_tensors
from flcore.servers.servermtl import mean_regularised_relationships, relationship_anchor
from helpers import assert_lag_composes, perturb_all_clients, play_round, server_for, state_equal, train


def test_the_anchor_gives_the_gradient_of_half_the_trace_regulariser():
    generator = torch.Generator().manual_seed(0)
    models = [{"w": torch.randn(2, 3, generator=generator), "b": torch.randn(3, generator=generator)}
              for _ in range(4)]
    omega_mean = mean_regularised_relationships(4)
    # I - 11^T/m by hand, and tr(W Omega W^T) = sum_t ||w_t - mean||^2 for it.
    assert torch.allclose(omega_mean, torch.tensor([[0.75, -0.25, -0.25, -0.25], [-0.25, 0.75, -0.25, -0.25],
                                                    [-0.25, -0.25, 0.75, -0.25], [-0.25, -0.25, -0.25, 0.75]],
                                                   dtype=torch.float64))
    # The mean-regularised anchor of task 1 is the mean of the three others.
    anchor = relationship_anchor(omega_mean[1], 1, models, ["w", "b"])
    for name in ("w", "b"):
        assert torch.allclose(anchor[name], (models[0][name] + models[2][name] + models[3][name]) / 3)
    # Any symmetric Omega with a positive diagonal: d/dw_t 1/2 tr(W Omega W^T) = Omega_tt (w_t - a_t).
    omega = torch.tensor([[2.0, -0.5, 0.3, 0.0], [-0.5, 1.5, -0.7, 0.2], [0.3, -0.7, 1.0, -0.1],
                          [0.0, 0.2, -0.1, 0.8]], dtype=torch.float64)
    for omega_matrix in (omega_mean, omega):
        for task in range(4):
            W = torch.stack([torch.cat([m["w"].flatten(), m["b"]]) for m in models], dim=1).double()  # (9, 4)
            W.requires_grad_(True)
            (0.5 * torch.trace(W @ omega_matrix @ W.T)).backward()
            a = relationship_anchor(omega_matrix[task], task, models, ["w", "b"])
            expected = omega_matrix[task, task] * (W[:, task].detach() - torch.cat([a["w"].flatten(), a["b"]]).double())
            assert torch.allclose(W.grad[:, task], expected, atol=1e-6), task


def test_the_local_objective_pulls_each_task_by_lamda_times_its_row_of_w_omega(data_dir, tmp_path):
    """The defining step: the regulariser's gradient in w_t is lamda (W Omega)_t over every task's model as
    the server knows it; without it FedMTL is Local (PFLlib's version, whose regulariser has no gradient)."""
    lamda = 0.7
    server = server_for(data_dir, tmp_path, "-algo", "FedMTL", "-lam", str(lamda), "-jr", "0.5")
    play_round(server)  # some tasks now hold trained models the server has stored
    perturb_all_clients(server)
    server.selected_clients = server.select_clients()
    server.send_models()
    m = len(server.clients)
    known = server.known_models()
    for client in server.selected_clients:
        x, y = client.train_data.x[:10], client.train_data.y[:10]
        params = dict(client.model.named_parameters())
        extra = client.local_loss(x, y) - torch.nn.functional.cross_entropy(client.model(x), y)
        grads = dict(zip(params, torch.autograd.grad(extra, list(params.values()))))
        for name, w in params.items():
            # lamda * (Omega_tt w_t + sum_{s != t} Omega_ts w_s), Omega = I - 11^T/m: lamda * (w_t - mean of all)
            others = sum(known[s][name] for s in range(m) if s != client.id)
            expected = lamda * ((1 - 1 / m) * w.detach() - others / m)
            assert torch.allclose(grads[name], expected, atol=1e-5), (client.id, name)


def test_models_stay_each_tasks_own_and_the_server_keeps_every_upload(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedMTL", "-jr", "0.5")
    initial = copy.deepcopy(named_tensors(server.global_model))
    play_round(server)
    uploaded = {u.client_id for u in server.uploads}
    for client in server.clients:
        stored = server.latest_models[client.id]
        if client.id in uploaded:
            assert state_equal(stored, client.module_tensors())
        else:
            assert stored is None and state_equal(client.module_tensors(), initial)
    # The global model is the plain mean over all tasks (not-yet-trained ones at the initial model).
    known = server.known_models()
    for name, value in named_tensors(server.global_model).items():
        assert torch.allclose(value, sum(k[name] for k in known) / len(known), atol=1e-6), name
    # A broadcast loads nothing into any client: each model stays its own.
    perturb_all_clients(server)
    before = {c.id: copy.deepcopy(c.module_tensors()) for c in server.clients}
    server.selected_clients = server.select_clients()
    server.send_models()
    assert all(state_equal(c.module_tensors(), before[c.id]) for c in server.clients)


def test_fedmtl_plus_lag_does_not_couple_the_personal_layers(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedMTL+LAG", "--lag_top_k", "2")
    personal = assert_lag_composes(server, k=2)
    parameters = {n for n, _ in server.clients[0].model.named_parameters()}
    for client in server.selected_clients:
        assert set(client.relationship_anchor) == parameters - personal


def test_a_new_task_starts_at_the_mean_and_is_coupled_to_it(data_dir, tmp_path):
    lamda = 0.5
    server = server_for(data_dir, tmp_path, "-algo", "FedMTL", "-nc", "4", "-nnc", "1", "-ften", "0", "-gr", "1",
                        "-lam", str(lamda))
    train(server)
    newcomer = server.new_clients[0]
    known = server.known_models()
    mean = {n: sum(k[n] for k in known) / len(known) for n in known[0]}
    assert all(torch.allclose(t, mean[n], atol=1e-6) for n, t in newcomer.module_tensors().items())
    assert all(torch.allclose(a, mean[n], atol=1e-6) for n, a in newcomer.relationship_anchor.items())
    assert float(newcomer.relationship_self_weight) == pytest.approx(4 / 5)  # one more task: Omega_tt = m/(m+1)
