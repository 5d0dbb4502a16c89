"""The local objectives of the supported clients, as functions of (parameters, buffers, extras, batch).

Each class mirrors one client's ``local_loss`` term by term, in the same order of operations, so that
the per-client value differs from the sequential one only by how vmap batches the matrix products.
``extras`` are per-client tensors fixed for the round (the received model, FedDyn's gradient
estimate, FedLC's offsets), taken from the client after its ``begin_local_training``; the engine
stacks them along the client axis. Hyper-parameters must be equal across the clients trained
together (they come from the flags).
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch
import torch.nn.functional as F

from flcore.batched.functional import FunctionalNet, Tensors, part_of
from flcore.clients.clientmoon import model_contrastive_loss


def common(clients: Sequence, attr: str) -> float:
    """The one value of ``client.<attr>`` shared by ``clients``."""
    values = {float(getattr(client, attr)) for client in clients}
    if len(values) != 1:
        raise ValueError(f"clients trained together need one value of {attr}, got {sorted(values)}")
    return values.pop()


def _params(module, prefix: str) -> Tensors:
    return {prefix + name: p.detach() for name, p in module.named_parameters()}


def _buffers(module, prefix: str) -> Tensors:
    return {prefix + name: b.detach() for name, b in module.named_buffers()}


def _teacher(module, name: str) -> Tensors:
    """A frozen model the loss runs (the received model, MOON's previous base): its parameters under
    ``name.`` and its buffers under ``name_buffer.``, as :func:`_teacher_state` reads them back."""
    return {**_params(module, f"{name}."), **_buffers(module, f"{name}_buffer.")}


def _teacher_state(extras: Tensors, name: str) -> Tuple[Tensors, Tensors]:
    """(parameters, buffers) of the frozen model :func:`_teacher` put into ``extras`` under ``name``."""
    return part_of(extras, f"{name}."), part_of(extras, f"{name}_buffer.")


def squared_distance(params: Tensors, anchor: Tensors, names: List[str]) -> torch.Tensor:
    """``sum_l ||w_l - r_l||^2`` in parameter order, as ``flcore.training.received.squared_distance``."""
    return torch.stack([(params[n] - anchor[n]).pow(2).sum() for n in names]).sum()


class CrossEntropy:
    """``CE(model(x), y)``: :meth:`Client.local_loss`."""

    def __init__(self, clients: Sequence, net: FunctionalNet):
        self.net = net

    def extras(self, client) -> Tensors:
        return {}

    def __call__(self, params: Tensors, buffers: Tensors, extras: Tensors, x: torch.Tensor,
                 y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.net.run(x, params, buffers), y)


class Proximal(CrossEntropy):
    """FedProx: ``CE + mu/2 ||w - w_received||^2`` (CE alone when ``mu`` is 0)."""

    def __init__(self, clients, net):
        super().__init__(clients, net)
        self.mu = common(clients, "mu")

    def extras(self, client) -> Tensors:
        return _params(client.received_model, "received.") if self.mu else {}

    def __call__(self, params, buffers, extras, x, y):
        loss = F.cross_entropy(self.net.run(x, params, buffers), y)
        if self.mu == 0:
            return loss
        return loss + 0.5 * self.mu * squared_distance(params, part_of(extras, "received."), self.net.param_names)


class Dynamic(CrossEntropy):
    """FedDyn: ``CE + (alpha/2 ||w - w_received||^2 - <w, g_k>)``."""

    def __init__(self, clients, net):
        super().__init__(clients, net)
        self.alpha = common(clients, "alpha")

    def extras(self, client) -> Tensors:
        gradient = {f"gradient.{n}": t.detach() for n, t in client.previous_gradient.items()}
        return {**_params(client.received_model, "received."), **gradient}

    def __call__(self, params, buffers, extras, x, y):
        names = self.net.param_names
        loss = F.cross_entropy(self.net.run(x, params, buffers), y)
        gradient = part_of(extras, "gradient.")
        linear = torch.stack([(params[n] * gradient[n]).sum() for n in names]).sum()
        return loss + (0.5 * self.alpha * squared_distance(params, part_of(extras, "received."), names) - linear)


class Calibrated(CrossEntropy):
    """FedLC: ``CE(model(x) - offsets, y)`` with the client's own per-class offsets."""

    def extras(self, client) -> Tensors:
        return {"offsets": client.logit_offsets}

    def __call__(self, params, buffers, extras, x, y):
        return F.cross_entropy(self.net.run(x, params, buffers) - extras["offsets"], y)


def not_true_logits(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(B, C) -> (B, C-1) without each row's true class, the others in order (a gather, which vmap
    batches; ``clientntd.not_true_logits`` selects the same entries with a boolean mask)."""
    columns = torch.arange(logits.shape[1] - 1, device=logits.device)
    index = columns.unsqueeze(0) + (columns.unsqueeze(0) >= targets.unsqueeze(1)).long()
    return torch.gather(logits, 1, index)


class NotTrueDistillation(CrossEntropy):
    """FedNTD: ``CE + beta * tau^2 * KL(softmax(g_nt / tau) || softmax(l_nt / tau))`` (batch mean), the
    teacher being the received model in eval mode."""

    def __init__(self, clients, net):
        super().__init__(clients, net)
        self.beta = common(clients, "beta")
        self.tau = common(clients, "tau")

    def extras(self, client) -> Tensors:
        if self.beta == 0:
            return {}
        return _teacher(client.received_model, "received")

    def __call__(self, params, buffers, extras, x, y):
        logits = self.net.run(x, params, buffers)
        loss = F.cross_entropy(logits, y)
        if self.beta == 0:
            return loss
        with torch.no_grad():
            teacher = self.net.run(x, *_teacher_state(extras, "received"), training=False)
        local = F.log_softmax(not_true_logits(logits, y) / self.tau, dim=1)
        target = F.softmax(not_true_logits(teacher, y) / self.tau, dim=1)
        return loss + self.beta * (self.tau ** 2 * F.kl_div(local, target, reduction="batchmean"))


class ModelContrastive(CrossEntropy):
    """MOON: ``CE(head(z), y) + mu * l_con(z, z_received, z_previous)`` with ``z = base(x)``; both teachers'
    bases run in eval mode."""

    def __init__(self, clients, net):
        super().__init__(clients, net)
        self.mu = common(clients, "mu")
        self.tau = common(clients, "tau")

    def extras(self, client) -> Tensors:
        if self.mu == 0:
            return {}
        received = client.received_model.base
        return {**_teacher(received, "received"), **_teacher(client.previous_base, "previous")}

    def __call__(self, params, buffers, extras, x, y):
        run = self.net.run
        z = run(x, part_of(params, "base."), part_of(buffers, "base."), part="base")
        loss = F.cross_entropy(run(z, part_of(params, "head."), part_of(buffers, "head."), part="head"), y)
        if self.mu == 0:
            return loss
        with torch.no_grad():
            z_global = run(x, *_teacher_state(extras, "received"), part="base", training=False)
            z_previous = run(x, *_teacher_state(extras, "previous"), part="base", training=False)
        return loss + self.mu * model_contrastive_loss(z, z_global, z_previous, self.tau)


LOSSES: Dict[str, type] = {
    "cross_entropy": CrossEntropy,
    "proximal": Proximal,
    "dynamic": Dynamic,
    "calibrated": Calibrated,
    "not_true_distillation": NotTrueDistillation,
    "model_contrastive": ModelContrastive,
}
