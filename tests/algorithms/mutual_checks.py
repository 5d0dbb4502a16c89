"""Hand computations shared by the tests of the methods whose clients train a private model with the shared
one (FML, FedKD): the divergence written out, each model's own gradient, and what a newcomer starts from."""
from __future__ import annotations

import copy
from typing import Callable, Dict

import pytest
import torch
from torch import nn

from flcore.aggregation import named_tensors
from helpers import in_use, method_flags, server_for, state_equal, train


def hand_kl(target_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """sum_c p_c (log p_c - log q_c), averaged over the rows, with p = softmax(target) fixed, q = softmax(logits)."""
    p = torch.softmax(target_logits.detach(), dim=1)
    return (p * (torch.log(p) - torch.log_softmax(logits, dim=1))).sum(dim=1).mean()


def gradients_of(module: nn.Module, loss: Callable[[nn.Module], torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The gradient of ``loss(copy)`` with respect to each parameter of a copy of ``module`` (left untouched)."""
    probe = copy.deepcopy(module)
    for param in probe.parameters():
        param.grad = None
    params = dict(probe.named_parameters())
    grads = torch.autograd.grad(loss(probe), list(params.values()), allow_unused=True)
    return {n: (torch.zeros_like(p) if g is None else g) for (n, p), g in zip(params.items(), grads)}


def assert_gradients(module: nn.Module, expected: Dict[str, torch.Tensor]) -> None:
    for name, param in module.named_parameters():
        assert param.grad is not None, name
        assert torch.allclose(param.grad, expected[name], atol=1e-6, rtol=1e-5), name


def assert_one_backward_gives_each_model_its_own_loss(client, x: torch.Tensor, y: torch.Tensor,
                                                      private_loss: Callable[[nn.Module], torch.Tensor],
                                                      shared_loss: Callable[[nn.Module], torch.Tensor]) -> None:
    """``client.local_loss(x, y)`` equals ``private_loss(private_model) + shared_loss(model)`` (the hand
    formulas), and its backward pass gives each model the gradient of its own loss alone: the other model's
    outputs are fixed targets."""
    with torch.no_grad():
        expected = float(private_loss(client.private_model) + shared_loss(client.model))
    client.optimizer.zero_grad()
    loss = client.local_loss(x, y)
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-5)
    loss.backward()
    assert_gradients(client.private_model, gradients_of(client.private_model, private_loss))
    assert_gradients(client.model, gradients_of(client.model, shared_loss))


def snapshot(module: nn.Module) -> dict:
    return {n: t.detach().clone() for n, t in named_tensors(module).items()}


def assert_newcomer_gets_the_global_shared_model_and_a_fresh_private_one(data_dir, tmp_path, name: str, *extra,
                                                                        also: Callable = lambda newcomer: None):
    """A run of ``name`` with one new client (-ften 0): its shared model is the global one, its private model
    the initial model every training client's private model started from, and ``also(newcomer)`` holds; then
    its fine-tuning moves both models."""
    server = server_for(data_dir, tmp_path, "-algo", name, "-nc", "4", "-nnc", "1", "-ften", "0", "-gr", "1",
                        *method_flags(name), *extra)
    initial = snapshot(in_use(server.clients[0]).private_model)
    train(server)
    newcomer = in_use(server.new_clients[0])
    assert state_equal(named_tensors(newcomer.model), named_tensors(server.global_model))
    assert not state_equal(named_tensors(server.global_model), initial)  # the global model has trained
    assert state_equal(named_tensors(newcomer.private_model), initial)
    # Not any training client's private model (with -jr 1 every one has trained).
    assert all(not state_equal(named_tensors(in_use(c).private_model), initial) for c in server.clients)
    also(newcomer)
    shared, private = snapshot(newcomer.model), snapshot(newcomer.private_model)
    newcomer.fine_tune(1)
    assert not state_equal(named_tensors(newcomer.model), shared)
    assert not state_equal(named_tensors(newcomer.private_model), private)
