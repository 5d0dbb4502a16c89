"""FedGC's cross-client regulariser on the clients' class embeddings (Niu and Deng, "Federated Learning for
Face Recognition with Gradient Correction", AAAI 2022).

Each client ``i`` classifies its own classes with a bias-free linear head whose rows ``W[i, c]`` are class
embeddings; its softmax only ever sees its own classes, so nothing separates its embeddings from another
client's. The server adds that missing part of a softmax over everyone's classes: every class embedding
``a = W[i, c]`` stands in for the features of its class (after training it points at their centre) and is
contrasted with the embeddings of the other clients' other classes::

    Reg(W) = sum_{(i, c) held} -log( e^{a.a} / (e^{a.a} + sum_{l != i, j held by l, j != c} e^{a.W[l, j]}) )

with ``a`` held constant (a stop-gradient), so that the gradient reaches only the cross-client negatives
``W[l, j]``, as ``p_j * a``: the term a softmax over all classes would have given them. With disjoint
class sets (the paper's faces, one identity per client) the negatives are all other clients' embeddings;
with shared labels the same class held by another client is no negative. The server then steps
``W <- W - lamda * lr * grad Reg(W)``.
"""
from __future__ import annotations

import torch


def cross_client_regulariser(embeddings: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
    """``Reg(W)`` above, a scalar.

    ``embeddings``: (N, C, D), client ``i``'s embedding of class ``c`` in row ``[i, c]``; ``held``: (N, C)
    bool, the classes each client holds (rows of classes it lacks are neither anchors nor negatives).
    Differentiable in ``embeddings`` through the negatives only.
    """
    clients, classes = held.shape
    owner, label = held.nonzero(as_tuple=True)                      # one anchor per held (client, class)
    anchors = embeddings[owner, label].detach()                     # (P, D)
    flat = embeddings.reshape(clients * classes, -1)                # (N*C, D)
    row_owner = torch.arange(clients, device=held.device).repeat_interleave(classes)
    row_label = torch.arange(classes, device=held.device).repeat(clients)
    negative = (held.reshape(-1).unsqueeze(0) & (row_owner.unsqueeze(0) != owner.unsqueeze(1))
                & (row_label.unsqueeze(0) != label.unsqueeze(1)))   # (P, N*C)
    positive = (anchors * anchors).sum(dim=1, keepdim=True)         # (P, 1)
    scores = (anchors @ flat.T).masked_fill(~negative, float("-inf"))
    return (torch.logsumexp(torch.cat([positive, scores], dim=1), dim=1) - positive.squeeze(1)).sum()


def corrected_embeddings(embeddings: torch.Tensor, held: torch.Tensor, step: float) -> torch.Tensor:
    """``W - step * grad Reg(W)`` (a new tensor; ``embeddings`` is left as it is)."""
    weights = embeddings.detach().clone()
    if step == 0 or not bool(held.any()):
        return weights
    weights.requires_grad_(True)
    with torch.enable_grad():
        gradient, = torch.autograd.grad(cross_client_regulariser(weights, held), weights)
    return (weights - step * gradient).detach()
