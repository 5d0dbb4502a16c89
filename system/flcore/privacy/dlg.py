"""Deep Leakage from Gradients (Zhu, Liu and Han, NeurIPS 2019): rebuild a training batch from its gradient.

The attacker holds the model the gradient was taken on and the gradient itself, not the batch. It draws a
dummy batch and dummy labels and moves both until the gradient the dummy batch gives matches the observed
one: it minimises the paper's objective, the squared Euclidean distance between the two gradients summed
over the tensors observed, with L-BFGS, the paper's optimiser. The labels are soft, the softmax of dummy
logits optimised with the inputs, and the loss is the cross-entropy against them, as in the paper (for a
one-hot label it is the client's own training loss).

Where PFLlib's version departs from the paper, the paper is followed:

* the dummy inputs are optimised as the model takes them, unbounded (PFLlib passes them through a sigmoid,
  which confines them to [0, 1] while real images here lie in [-1, 1]);
* the loss is the cross-entropy against soft labels (PFLlib matches the mean squared error between the
  model's output and a dummy output vector, an objective no client trains on).

What gradient a round's upload reveals, and which model it was taken on, is the server's part
(:mod:`flcore.privacy.leakage`); this module needs only a model, a gradient by parameter name and the
shape of the batch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence, Tuple

import torch
from torch import nn

# L-BFGS iterations per batch: a fixed budget, so an evaluation costs the same whatever the data (at most
# 1.25 evaluations of the gradient distance per iteration, each a forward pass and two backward passes
# through the model). PFLlib runs 100 L-BFGS steps of up to 20 iterations each, 2,000 in all; on the small
# models and images of this project's tests and benchmark the reconstruction has settled well before 100
# (a single 8x8 image is rebuilt to ~90 dB).
ITERATIONS = 100
# L-BFGS's memory of past steps, as many as it can use within the budget.
HISTORY = 100


@dataclass(frozen=True)
class Reconstruction:
    """The outcome of one attack: the dummy batch and label logits of the best match found (the lowest
    gradient distance met, so a step that diverges late loses nothing), that distance relative to the
    observed gradient's squared norm, and the random batch the attack started from."""
    inputs: torch.Tensor
    label_logits: torch.Tensor
    distance: float
    start: torch.Tensor


class _Diverged(Exception):
    """The gradient distance became NaN or infinite: the search stops with the best match so far."""


def soft_cross_entropy(logits: torch.Tensor, soft_labels: torch.Tensor) -> torch.Tensor:
    """The mean over the batch of the cross-entropy of ``logits`` against label distributions: for one-hot
    labels, ``nn.CrossEntropyLoss()``, the loss clients train on."""
    return -(soft_labels * torch.log_softmax(logits, dim=-1)).sum(dim=-1).mean()


def gradient_distance(model: nn.Module, observed: Mapping[str, torch.Tensor], inputs: torch.Tensor,
                      label_logits: torch.Tensor) -> torch.Tensor:
    """The paper's objective: ``sum over observed tensors of ||d loss / d theta - observed||^2``, the loss
    being :func:`soft_cross_entropy` of ``model(inputs)`` against ``softmax(label_logits)``; differentiable
    in ``inputs`` and ``label_logits``. ``observed``: gradients by the model's parameter names."""
    parameters = dict(model.named_parameters())
    names = list(observed)
    loss = soft_cross_entropy(model(inputs), torch.softmax(label_logits, dim=-1))
    grads = torch.autograd.grad(loss, [parameters[n] for n in names], create_graph=True)
    return sum(((g - observed[n]) ** 2).sum() for g, n in zip(grads, names))


def parameters_in_loss(model: nn.Module, names: Sequence[str], batch_shape: Sequence[int],
                       num_classes: int) -> Tuple[str, ...]:
    """Those of the parameters ``names`` that the classification loss of ``model(x)`` depends on. A method's
    own modules inside the model that only its own loss trains (GPFL's conditional embeddings) have no
    gradient here, so no dummy batch can match their update: they are left out of the match. Found on a
    batch of zeros (only the graph matters), drawing nothing random."""
    parameters = dict(model.named_parameters())
    device = parameters[names[0]].device if names else torch.device("cpu")
    inputs = torch.zeros(tuple(batch_shape), device=device, dtype=next(model.parameters()).dtype)
    uniform = torch.full((batch_shape[0], num_classes), 1.0 / num_classes, device=device, dtype=inputs.dtype)
    loss = soft_cross_entropy(model(inputs), uniform)
    grads = torch.autograd.grad(loss, [parameters[n] for n in names], allow_unused=True)
    return tuple(n for n, g in zip(names, grads) if g is not None)


def reconstruct(model: nn.Module, observed: Mapping[str, torch.Tensor], batch_shape: Sequence[int],
                num_classes: int, generator: torch.Generator, iterations: int = ITERATIONS) -> Reconstruction:
    """Rebuild a batch of shape ``batch_shape`` (N x C x H x W) whose gradient on ``model`` is ``observed``.

    ``model`` must be ready for the attack: in the mode the client trained in, with the parameters named
    in ``observed`` requiring gradients (others may not). Neither it nor ``observed`` is changed. The dummy
    batch and label logits start from standard normal draws of ``generator`` (a CPU generator: the same start
    on every device), nothing else random is drawn, and the search runs at most ``iterations`` L-BFGS
    iterations.

    The distance is divided by the observed gradient's squared norm (1 for a zero gradient): a constant,
    so the best match is the paper's, and L-BFGS's first step and stopping tolerances then mean the same
    for a large model's update as for a small one's.
    """
    device = next(iter(observed.values())).device if observed else torch.device("cpu")
    dtype = next(model.parameters()).dtype
    inputs = torch.randn(tuple(batch_shape), generator=generator).to(device, dtype).requires_grad_(True)
    logits = torch.randn((batch_shape[0], num_classes), generator=generator).to(device, dtype).requires_grad_(True)
    start = inputs.detach().clone()
    observed = {name: g.detach() for name, g in observed.items()}
    scale = float(sum((g.double() ** 2).sum() for g in observed.values())) or 1.0
    best = {"distance": math.inf, "inputs": start, "logits": logits.detach().clone()}
    optimizer = torch.optim.LBFGS([inputs, logits], lr=1.0, max_iter=iterations, history_size=HISTORY)

    def closure() -> torch.Tensor:
        distance = gradient_distance(model, observed, inputs, logits) / scale
        value = float(distance.detach())
        if not math.isfinite(value):
            raise _Diverged
        if value < best["distance"]:
            best.update(distance=value, inputs=inputs.detach().clone(), logits=logits.detach().clone())
        # Contiguous: L-BFGS flattens them with view(), and a channels-last model hands back channels-last ones.
        inputs.grad, logits.grad = (g.contiguous() for g in torch.autograd.grad(distance, [inputs, logits]))
        return distance.detach()

    try:
        optimizer.step(closure)
    except _Diverged:
        pass
    return Reconstruction(best["inputs"], best["logits"], best["distance"], start)
