"""A count sketch of a personal layer's update: what crosses the wire with ``--lag_upload sketch``.

FedLAG scores every layer every round, the personal ones included, so that a personal layer whose updates
stop conflicting can return to the average. By default a client therefore uploads its personal layers as
well (the server never sends them back, but it receives them). With ``--lag_upload sketch`` a client keeps
its personal layers' tensors and uploads, for each, ``--lag_sketch_dim`` numbers instead: a count sketch of
the layer's update, ``s[k] = sum_{j: h(j) = k} sign(j) * update[j]``, with the buckets ``h`` and signs drawn
once per run and layer from the run's seed, the same for every client. The sketch is linear and
``E[<S a, S b>] = <a, b>``, so the server's cosines (and their Gram matrices) of the sketches estimate those of
the updates, with an error of about ``|a| |b| / sqrt(dim)`` per pair; the scoring reads a layer's sketches in
place of its updates and nothing else changes.

A sketch of at least as many numbers as the layer holds would be a signed permutation of its update,
invertible by anyone who knows the seed; :func:`sketch_size` caps it at a quarter of the layer's values.
Pure torch, as the rest of ``lag/``.
"""
from __future__ import annotations

from typing import Tuple

import torch

# A sketch holds at most this share of its layer's values (so it never determines the update).
MAX_SHARE = 4
_MIX = 0x9E3779B97F4A7C15  # an odd 64-bit constant: seeds of neighbouring layers and runs far apart


def sketch_size(layer_size: int, dim: int) -> int:
    """The numbers uploaded for a layer of ``layer_size`` values asked to sketch into ``dim``: at most a
    quarter of the layer, at least one."""
    return max(1, min(int(dim), int(layer_size) // MAX_SHARE))


def sketch_map(layer_size: int, dim: int, seed: int, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(buckets, signs)``: each of the layer's values' bucket in ``range(dim)`` and its sign (+-1, float64),
    drawn from a generator of the run's ``seed`` and the ``layer`` index alone (every client draws the same).
    With ``dim >= layer_size`` the buckets are a permutation (the sketch is then exact: inner products kept)."""
    generator = torch.Generator().manual_seed((int(seed) * _MIX + int(layer) + 1) % (1 << 63))
    if dim >= layer_size:
        buckets = torch.randperm(layer_size, generator=generator)
    else:
        buckets = torch.randint(0, dim, (layer_size,), generator=generator)
    signs = torch.randint(0, 2, (layer_size,), generator=generator).double().mul_(2).sub_(1)
    return buckets, signs


def count_sketch(values: torch.Tensor, buckets: torch.Tensor, signs: torch.Tensor, dim: int) -> torch.Tensor:
    """The (m, dim) sketches of the (m, layer size) rows ``values``, in their dtype and on their device."""
    signed = values * signs.to(device=values.device, dtype=values.dtype)
    out = torch.zeros((values.shape[0], dim), dtype=values.dtype, device=values.device)
    return out.index_add_(1, buckets.to(values.device), signed)
