"""FedLAG's conflict analysis as pure tensor functions (no server, no client, no I/O).

Paper: "Towards Layer-Wise Personalized Federated Learning: Adaptive Layer Disentanglement via
Conflicting Gradients" (arXiv 2410.02845), Def. 4.1 / Eq. (3):

    GC_xi(l) = #{ unordered client pairs (u, v) : cos(h_{l,u}, h_{l,v}) < xi }

where ``h_{l,u}`` is client u's update of layer l. The cosines of all pairs of one layer come from one
Gram matrix of row-normalised updates (``G = U_hat U_hat^T``), not from a loop over pairs. A pair in
which either update has zero norm has no direction and is not counted.

This module imports only torch, so the ``lag/`` package can be copied into a PFLlib checkout.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Sequence, Tuple

import torch

GRANULARITIES = ("tensor", "module")


@dataclass(frozen=True)
class Layer:
    """One unit of personalisation: a parameter tensor, or all parameters of one module."""
    name: str
    tensors: Tuple[str, ...]


def build_layers(param_names: Sequence[str], granularity: str = "tensor") -> List[Layer]:
    """Group parameter names (in ``named_parameters()`` order) into layers.

    ``tensor``: every parameter tensor is a layer (the authors' code). ``module``: the parameters
    of one module (``conv.weight`` and ``conv.bias``) form one layer, named after the module.
    Only parameter names are given here, so buffers can never become layers.
    """
    if granularity == "tensor":
        return [Layer(n, (n,)) for n in param_names]
    if granularity != "module":
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    groups: Dict[str, List[str]] = {}
    for n in param_names:
        groups.setdefault(n.rpartition(".")[0], []).append(n)
    return [Layer(module or "(root)", tuple(names)) for module, names in groups.items()]


def with_module_buffers(model: torch.nn.Module, param_names: Sequence[str]) -> Dict[str, torch.Tensor]:
    """The live tensors that stay personal for ``param_names``: each parameter and the buffers of its
    module (BatchNorm statistics follow their module; buffers are never scored as layers)."""
    params = dict(model.named_parameters())
    out: Dict[str, torch.Tensor] = {}
    for name in param_names:
        out[name] = params[name]
        module_name = name.rpartition(".")[0]
        prefix = f"{module_name}." if module_name else ""
        for buffer_name, buffer in model.get_submodule(module_name).named_buffers(recurse=False):
            out[prefix + buffer_name] = buffer
    return out


def stack_layer_updates(updates: Sequence[Mapping[str, torch.Tensor]], layers: Sequence[Layer]) -> List[torch.Tensor]:
    """Per layer, the clients' updates as rows: a list of ``(num_clients, layer_size)`` matrices."""
    return [torch.stack([torch.cat([u[n].reshape(-1) for n in layer.tensors]) for u in updates])
            for layer in layers]


def gram_cosines(gram: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Cosines from a Gram matrix ``G = U U^T``: ``G_ij / (|u_i| |u_j|)``, and which rows are non-zero.

    Scaling the m x m Gram matrix is the same as normalising the rows first, without an m x d copy.
    """
    norms = gram.diagonal().clamp(min=0).sqrt()
    valid = norms > 0
    safe = torch.where(valid, norms, torch.ones_like(norms))
    # Rounding can put an exactly antiparallel pair at -1 - 1e-7; a cosine is never below -1 (so that
    # xi = -1 counts nothing, as its definition says).
    return (gram / safe.unsqueeze(0) / safe.unsqueeze(1)).clamp(-1.0, 1.0), valid


def pairwise_cosines(updates: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Cosine of every pair of rows of ``updates`` (m x d) through one Gram matrix.

    Returns ``(cos, valid)``: the m x m cosine matrix and an m-vector telling which rows have a
    non-zero norm (rows of zero norm get cosine 0 with everything and must not be counted).
    """
    rows = updates.reshape(updates.shape[0], -1)
    return gram_cosines(rows @ rows.T)


def count_below(cos: torch.Tensor, valid: torch.Tensor, xi: float) -> int:
    """Unordered pairs of valid rows whose cosine is strictly below ``xi``."""
    both_valid = valid.unsqueeze(0) & valid.unsqueeze(1)
    upper = torch.ones_like(cos, dtype=torch.bool).triu(diagonal=1)
    return int(((cos < xi) & both_valid & upper).sum())


def conflict_count(updates: torch.Tensor, xi: float) -> int:
    """GC_xi of one layer: unordered pairs of valid rows whose cosine is strictly below ``xi``."""
    return count_below(*pairwise_cosines(updates), xi)


def conflict_scores(layer_updates: Sequence[torch.Tensor], xi: float) -> torch.Tensor:
    """GC_xi for every layer: an int64 vector, one entry per layer."""
    return torch.tensor([conflict_count(u, xi) for u in layer_updates], dtype=torch.int64)


@dataclass(frozen=True)
class LayerEvidence:
    """One round's conflict evidence for L layers, from the cosines of every pair of non-zero updates.

    ``conflicts[l]``: GC_xi of layer l (pairs with cosine < xi); ``pairs[l]``: the pairs it was counted
    over; ``cosine_sums[l]``: the sum of those pairs' cosines (their mean says how far apart layer l's
    updates point, not only on which side of xi). ``gap_sums[a, b]`` and ``gap_squares[a, b]``: the sum and
    sum of squares, over the pairs scored in both layers (``common_pairs[a, b]`` of them), of
    ``cos_b - cos_a``: how much more the same two clients disagree on layer a than on layer b. Layers are
    compared pair for pair because their cosines move together (two clients with different labels
    disagree on every layer), so the paired difference is far less noisy than either mean.
    """
    conflicts: torch.Tensor    # (L,) int64
    pairs: torch.Tensor        # (L,) int64
    cosine_sums: torch.Tensor  # (L,) float64
    gap_sums: torch.Tensor     # (L, L) float64
    gap_squares: torch.Tensor  # (L, L) float64
    common_pairs: torch.Tensor  # (L, L) int64

    def mean_cosines(self) -> torch.Tensor:
        """The round's mean pairwise cosine per layer (float64), NaN where no pair was scored."""
        pairs = self.pairs.double()
        return torch.where(pairs > 0, self.cosine_sums / pairs.clamp(min=1), torch.full_like(pairs, float("nan")))


def evidence_from_cosines(counted: Sequence[Tuple[torch.Tensor, torch.Tensor]], xi: float) -> LayerEvidence:
    """:class:`LayerEvidence` from each layer's ``(m x m cosines, m valid rows)`` over the same m clients."""
    upper = None
    cosines, masks = [], []
    for cos, valid in counted:
        if upper is None:
            upper = torch.ones_like(cos, dtype=torch.bool).triu(diagonal=1)
        both = valid.unsqueeze(0) & valid.unsqueeze(1)
        cosines.append(cos[upper].double())
        masks.append(both[upper])
    if not counted:
        empty = torch.zeros(0, dtype=torch.int64)
        square = torch.zeros((0, 0), dtype=torch.float64)
        return LayerEvidence(empty, empty, empty.double(), square, square, square.long())
    mask = torch.stack(masks).double()                     # (L, P): 1 where the pair is scored in layer l
    values = torch.stack(cosines) * mask                   # (L, P): the scored cosines, 0 elsewhere
    squares = values * values
    common = mask @ mask.T
    # sum over common pairs of (cos_b - cos_a) and of its square, for every (a, b), as matrix products.
    gap_sums = mask @ values.T - values @ mask.T
    gap_squares = mask @ squares.T - 2 * (values @ values.T) + squares @ mask.T
    conflicts = torch.stack([((c < xi) & m) for c, m in zip(cosines, masks)]).sum(dim=1)
    return LayerEvidence(conflicts.to(torch.int64), mask.sum(dim=1).round().to(torch.int64), values.sum(dim=1),
                         gap_sums, gap_squares.clamp(min=0), common.round().to(torch.int64))


def layer_evidence_in_spans(updates: torch.Tensor, spans: Sequence[Sequence[Tuple[int, int]]], xi: float,
                            rows: Sequence[int] | None = None) -> LayerEvidence:
    """Every layer's :class:`LayerEvidence` from one ``(clients, parameters)`` matrix.

    The matrix's columns are the flat model; ``spans[l]`` lists the column ranges of layer l (a single
    range is used as a strided view, so no per-layer copy is made). ``rows`` restricts the count to some
    clients (all by default).
    """
    index = None if rows is None else torch.as_tensor(list(rows), dtype=torch.long, device=updates.device)
    counted = []
    for layer_spans in spans:
        block = (updates[:, layer_spans[0][0]:layer_spans[0][1]] if len(layer_spans) == 1
                 else torch.cat([updates[:, a:b] for a, b in layer_spans], dim=1))
        gram = block @ block.T
        if index is not None:
            gram = gram[index][:, index]
        counted.append(gram_cosines(gram))
    return evidence_from_cosines(counted, xi)


def layer_evidence(layer_updates: Sequence[torch.Tensor], xi: float) -> LayerEvidence:
    """Every layer's :class:`LayerEvidence` from one ``(clients, layer_size)`` matrix per layer."""
    return evidence_from_cosines([pairwise_cosines(u) for u in layer_updates], xi)


def conflict_scores_in_spans(updates: torch.Tensor, spans: Sequence[Sequence[Tuple[int, int]]], xi: float,
                             rows: Sequence[int] | None = None) -> torch.Tensor:
    """GC_xi per layer (see :func:`layer_evidence_in_spans`)."""
    return layer_evidence_in_spans(updates, spans, xi, rows).conflicts


def top_k_layers(scores: torch.Tensor, k: int) -> List[int]:
    """Indices of the ``k`` highest scores; ties go to the earlier layer; ``k`` may exceed the count."""
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))  # sorted() is stable
    return sorted(order[:max(k, 0)])
