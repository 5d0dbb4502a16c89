"""FedKD's dynamic gradient approximation, as pure functions of tensors.

Wu, Wu, Lyu, Huang, Xie, "Communication-efficient federated learning via knowledge distillation", Nature
Communications 13, 2032 (2022): an update matrix ``M = U S V^T`` travels as its first k singular triplets,
the fewest whose energy (sum of squared singular values) is at least a share T of the whole; T rises
over the rounds from ``T_start`` to ``T_end``. Both directions are compressed: each client's update and
the server's mean of them.

A tensor of more than two dimensions (a convolution's (out, in, kh, kw)) is compressed as the
(out, in * kh * kw) matrix; vectors, scalars and integer tensors (biases, counters) travel whole, as in
the authors' code, which compresses only matrices. A matrix whose factors would take more numbers than
the matrix itself (a small or nearly full-rank one) travels whole.
"""
from __future__ import annotations

from typing import Dict, Mapping, Tuple

import torch

State = Dict[str, torch.Tensor]


def compressible(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` travels as a truncated SVD: a floating-point tensor of two or more dimensions."""
    return tensor.is_floating_point() and tensor.dim() >= 2


def kept_rank(singular_values: torch.Tensor, energy: float) -> int:
    """The fewest leading singular values (``singular_values``: (r,), descending) whose squares sum to at
    least ``energy`` times the total; 0 for a zero matrix, at most r."""
    squares = singular_values.double().pow(2)
    total = float(squares.sum())
    if total == 0.0:
        return 0
    below = int((torch.cumsum(squares, 0) < energy * total).sum())
    return min(below + 1, singular_values.numel())


def truncated(tensor: torch.Tensor, energy: float) -> Tuple[torch.Tensor, int]:
    """``tensor`` (compressible, any shape (m, ...)) as its truncated SVD keeping ``energy`` of it, in its
    own shape, and how many numbers that form sends: k * (m + n + 1) for an (m, n) matrix of rank k kept.
    Where those factors would not be fewer numbers than the m * n of the matrix, it travels whole (exact)."""
    matrix = tensor.detach().reshape(tensor.shape[0], -1)
    rows, columns = matrix.shape
    u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
    k = kept_rank(s, energy)
    if k * (rows + columns + 1) >= rows * columns:
        return tensor.detach().clone(), rows * columns
    approximation = (u[:, :k] * s[:k]) @ vh[:k]
    return approximation.reshape(tensor.shape), k * (rows + columns + 1)


def low_rank_step(start: Mapping[str, torch.Tensor], end: Mapping[str, torch.Tensor],
                  energy: float) -> Tuple[State, int]:
    """What the other side rebuilds of the move from ``start`` to ``end`` (tensors by name): ``start`` plus
    the truncated SVD of ``end - start`` for every compressible tensor, ``end`` itself for the others; and
    the numbers sent for it."""
    rebuilt: State = {}
    sent = 0
    for name, target in end.items():
        if compressible(target):
            update, numbers = truncated(target.detach() - start[name], energy)
            rebuilt[name] = start[name] + update
            sent += numbers
        else:
            rebuilt[name] = target.detach()
            sent += target.numel()
    return rebuilt, sent


def dense_size(tensors: Mapping[str, torch.Tensor]) -> int:
    """Numbers sent for ``tensors`` without compression."""
    return sum(t.numel() for t in tensors.values())


def scheduled_energy(start: float, end: float, round_index: int, last_round: int) -> float:
    """T of round ``round_index`` of rounds 0 .. ``last_round``: ``start`` in round 0, rising linearly to
    ``end`` in the last round (``start`` throughout when there is one round)."""
    if last_round <= 0:
        return start
    return start + (end - start) * min(round_index / last_round, 1.0)
