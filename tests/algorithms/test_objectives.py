"""Each local objective is written once (``flcore/training/objective.py``) and run by both executors: on
the client's own modules (``LiveModel``, the sequential path) and on stacked functional tensors under
vmap (``FunctionalModel``, the batched engine). The two agree on every supported client class; support
is each class's own declaration, which a subclass does not inherit."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch.func import grad_and_value, vmap

from helpers import in_use, assert_same_training, method_flags, server_for, train_both
from flcore.vmapped.engine import per_client_loss
from flcore.vmapped.functional import FunctionalNet
from flcore.vmapped.stacking import StackedModels, stack_dicts
from flcore.vmapped.support import PLAIN, Recipe, batched_problem, recipe_of
from flcore.vmapped.view import round_inputs
from flcore.clients.clientprox import Proximal, clientProx
from flcore.registry import ALGORITHMS, resolve
from flcore.servers.serverprox import FedProx
from flcore.training.objective import CrossEntropy, Objective
from utils.errors import ConfigError, RunError

# Flags that switch each regulariser on (their defaults may leave it at 0 on these runs).
ACTIVE = {"FedProx": ("-mu", "0.1"), "FedDyn": ("-al", "0.1"), "FedNTD": ("-bt", "1"), "MOON": ("-mu", "1"),
          "FedLC": ("-tau", "1"), "FedMTL": ("-lam", "1")}
CLIENTS, ROWS = 3, 8


def supported_algorithms():
    """One -algo name per client class that declares a Recipe."""
    names, classes = [], set()
    for name in ALGORITHMS:
        cls = resolve(name)[0].client_class
        if isinstance(recipe_of(cls), Recipe) and cls not in classes:
            names.append(name)
            classes.add(cls)
    return names


def clients_in_a_round(data_dir, tmp_path, algorithm):
    """``CLIENTS`` clients after ``begin_local_training``, their models moved away from what they received
    (so regularisers against it are not zero) and every round-fixed tensor of their own."""
    server = server_for(data_dir, tmp_path, "-algo", algorithm, "-jr", "1", *ACTIVE.get(algorithm, ()),
                        *method_flags(algorithm))
    server.selected_clients = server.select_clients()
    server.send_models()
    clients = server.clients[:CLIENTS]
    generator = torch.Generator().manual_seed(0)
    for client in map(in_use, clients):
        client.model.train()
        client.begin_local_training()
        moved = list(client.model.parameters())
        if hasattr(client, "previous_base"):  # MOON
            moved += list(client.previous_base.parameters())
        if hasattr(client, "previous_gradient"):  # FedDyn
            moved += list(client.previous_gradient.values())
        with torch.no_grad():
            for tensor in moved:
                tensor.add_(0.2 * torch.randn(tensor.shape, generator=generator))
    return clients


@pytest.mark.parametrize("algorithm", supported_algorithms())
def test_the_vmapped_objective_equals_the_sequential_one(algorithm, data_dir, tmp_path):
    """Loss and gradient of every trainable parameter, per client, on one batch each: the client's own
    ``local_loss`` against the engine's vmapped objective (equal up to how vmap batches the products)."""
    clients = clients_in_a_round(data_dir, tmp_path, algorithm)
    xs = torch.stack([c.train_data.x[:ROWS] for c in clients])
    ys = torch.stack([c.train_data.y[:ROWS] for c in clients])
    objective = clients[0].objective
    assert all(c.objective == objective for c in clients)
    if algorithm in ACTIVE:
        assert type(objective) is not CrossEntropy and objective.inputs()

    stacked = StackedModels([c.model for c in clients])
    extras = stack_dicts([round_inputs(objective, c) for c in clients])
    grads, losses = vmap(grad_and_value(per_client_loss(objective, FunctionalNet(clients[0].model))))(
        stacked.params, stacked.buffers, extras, xs, ys)

    for i, client in enumerate(clients):
        client.model.zero_grad(set_to_none=True)
        loss = client.local_loss(xs[i], ys[i])
        loss.backward()
        assert torch.allclose(losses[i], loss.detach(), rtol=1e-5, atol=1e-6), (client.id, losses[i], loss)
        for name, param in client.model.named_parameters():
            if param.requires_grad:
                # A parameter the objective never reads (FedPCL's head) has no gradient; vmap gives it zeros.
                expected = torch.zeros_like(param) if param.grad is None else param.grad
                assert torch.allclose(grads[name][i], expected, rtol=1e-5, atol=1e-6), (client.id, name)
        if algorithm in ACTIVE:  # the extra term is really there
            with torch.no_grad():
                plain = F.cross_entropy(client.model(xs[i]), ys[i])
            assert not torch.allclose(loss.detach(), plain, rtol=1e-4)


@dataclass(frozen=True)
class Doubled(Objective):
    """Twice another objective: a subclass's change the engine must not miss."""
    inner: Objective

    def inputs(self):
        return self.inner.inputs()

    def __call__(self, model, x, y):
        return 2 * self.inner(model, x, y)


class clientDoubledProx(clientProx):
    def setup(self) -> None:
        super().setup()
        self.objective = Doubled(self.objective)


def test_a_subclass_with_its_own_objective_is_refused_until_it_declares_support(data_dir, tmp_path, monkeypatch):
    from flcore.executors.vmapped import BatchedExecutor
    monkeypatch.setattr(FedProx, "client_class", clientDoubledProx)
    assert "batched" not in vars(clientDoubledProx) and isinstance(recipe_of(clientProx), Recipe)
    reason = "--executor batched cannot train FedProx: the client class clientDoubledProx is not declared"
    assert batched_problem("FedProx", "DNN").startswith(reason)
    server = server_for(data_dir, tmp_path / "refused", "-algo", "FedProx", "-mu", "0.1", "--executor", "batched")
    with pytest.raises(ConfigError, match="clientDoubledProx is not declared"):
        BatchedExecutor(server)

    monkeypatch.setattr(clientDoubledProx, "batched", PLAIN, raising=False)
    assert batched_problem("FedProx", "DNN") is None
    runs = train_both(data_dir, tmp_path, "-algo", "FedProx", "-mu", "0.1")
    assert isinstance(runs["batched"][0].clients[0].objective, Doubled)
    assert_same_training(runs)


def test_clients_trained_together_need_one_objective(data_dir, tmp_path):
    from flcore.executors.vmapped import BatchedExecutor
    server = server_for(data_dir, tmp_path, "-algo", "FedProx", "-mu", "0.1", "--executor", "batched")
    server.clients[0].objective = Proximal(0.5)
    server.selected_clients = server.clients
    server.send_models()
    with pytest.raises(RunError, match=r"need one objective, got \[Proximal\(mu=0.1\), Proximal\(mu=0.5\)\]"):
        BatchedExecutor(server).train(server.clients)
