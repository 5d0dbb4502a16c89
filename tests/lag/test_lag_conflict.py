"""FedLAG's conflict maths on hand-computed examples, and the Gram matrix against a pairwise loop."""
import itertools
import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from flcore.lag.conflict import (build_layers, conflict_count, conflict_scores, layer_evidence, pairwise_cosines,
                                 stack_layer_updates, top_k_layers)


def rows(*vectors):
    return torch.tensor(vectors, dtype=torch.float64)


# Three clients, three layers, cosines worked out by hand:
#   A: (1,0), (0,1), (-1,0)         -> cos12 = 0, cos13 = -1, cos23 = 0
#   B: (1,0), (-1,1), (1,1)         -> cos12 = -1/sqrt2 = -0.707, cos13 = +0.707, cos23 = 0
#   C: (1,0), (-0.3,1), (-1,-0.2)   -> cos12 = -0.287, cos13 = -0.981, cos23 = +0.094
LAYER_A = rows((1, 0), (0, 1), (-1, 0))
LAYER_B = rows((1, 0), (-1, 1), (1, 1))
LAYER_C = rows((1, 0), (-0.3, 1), (-1, -0.2))


def test_cosines_match_hand_computation():
    cos, valid = pairwise_cosines(LAYER_C)
    assert valid.all()
    assert math.isclose(cos[0, 1], -0.3 / math.sqrt(1.09), abs_tol=1e-12)
    assert math.isclose(cos[0, 2], -1 / math.sqrt(1.04), abs_tol=1e-12)
    assert math.isclose(cos[1, 2], 0.1 / math.sqrt(1.09 * 1.04), abs_tol=1e-12)


@pytest.mark.parametrize("xi,expected", [(0.0, [1, 1, 2]), (-0.5, [1, 1, 1]), (-0.99, [1, 0, 0]), (-1.0, [0, 0, 0])])
def test_conflict_scores_hand_computed(xi, expected):
    # xi = 0: A has pair 13 (cos12 = 0 is not < 0: strict), B pair 12, C pairs 12 and 13.
    # xi = -0.5: C's pair 12 (-0.287) no longer counts. xi = -1: nothing is strictly below -1.
    assert conflict_scores([LAYER_A, LAYER_B, LAYER_C], xi).tolist() == expected


def test_zero_norm_updates_are_never_counted():
    updates = rows((0, 0), (1, 0), (-1, 0), (0, 0))
    # With xi above 0 a zero row would "conflict" with everything (its cosine is 0); it must not.
    assert conflict_count(updates, 0.5) == 1
    assert conflict_count(rows((0, 0), (0, 0)), 0.5) == 0


def naive_count(updates, xi):
    count = 0
    for u, v in itertools.combinations(range(len(updates)), 2):
        a, b = updates[u], updates[v]
        if a.norm() == 0 or b.norm() == 0:
            continue
        if torch.nn.functional.cosine_similarity(a, b, dim=0) < xi:
            count += 1
    return count


@settings(max_examples=60, deadline=None)
@given(m=st.integers(2, 9), d=st.integers(1, 24), seed=st.integers(0, 2**31 - 1),
       zero_rows=st.integers(0, 2), xi=st.sampled_from([0.0, -0.1, -0.5, -0.9]))
def test_gram_matrix_equals_the_pairwise_loop(m, d, seed, zero_rows, xi):
    g = torch.Generator().manual_seed(seed)
    updates = torch.randn(m, d, generator=g, dtype=torch.float64)
    updates[:min(zero_rows, m)] = 0
    cos, _ = pairwise_cosines(updates)
    assume(bool(((cos - xi).abs() > 1e-9).all()))  # keep clear of the threshold itself
    assert conflict_count(updates, xi) == naive_count(updates, xi)


def naive_evidence(layers, xi):
    """Per layer: pairs, cosine sum; per pair of layers: common pairs, sum and sum of squares of the gap
    cos_b - cos_a; all by a loop over client pairs."""
    cosine = torch.nn.functional.cosine_similarity
    width, m = len(layers), len(layers[0])
    pairs, sums = [0] * width, [0.0] * width
    common = [[0] * width for _ in range(width)]
    gaps = [[0.0] * width for _ in range(width)]
    squares = [[0.0] * width for _ in range(width)]
    for u, v in itertools.combinations(range(m), 2):
        cos = [None if (x[u].norm() == 0 or x[v].norm() == 0) else float(cosine(x[u], x[v], dim=0)) for x in layers]
        for a in range(width):
            if cos[a] is None:
                continue
            pairs[a] += 1
            sums[a] += cos[a]
            for b in range(width):
                if cos[b] is not None:
                    common[a][b] += 1
                    gaps[a][b] += cos[b] - cos[a]
                    squares[a][b] += (cos[b] - cos[a]) ** 2
    return pairs, sums, common, gaps, squares


@settings(max_examples=40, deadline=None)
@given(m=st.integers(2, 8), seed=st.integers(0, 2**31 - 1), zero_rows=st.integers(0, 2))
def test_the_evidence_from_gram_matrices_equals_the_pairwise_loop(m, seed, zero_rows):
    g = torch.Generator().manual_seed(seed)
    layers = [torch.randn(m, d, generator=g, dtype=torch.float64) for d in (3, 7, 1)]
    layers[1][:min(zero_rows, m)] = 0   # zero updates in one layer only: its pairs drop out of that layer
    evidence = layer_evidence(layers, 0.0)
    pairs, sums, common, gaps, squares = naive_evidence(layers, 0.0)
    assert evidence.pairs.tolist() == pairs
    assert evidence.common_pairs.tolist() == common
    assert torch.allclose(evidence.cosine_sums, torch.tensor(sums, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(evidence.gap_sums, torch.tensor(gaps, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(evidence.gap_squares, torch.tensor(squares, dtype=torch.float64), atol=1e-12)
    assert evidence.conflicts.tolist() == [conflict_count(x, 0.0) for x in layers]


def test_top_k_breaks_ties_by_layer_order_and_tolerates_large_k():
    scores = torch.tensor([3, 5, 5, 1, 5])
    assert top_k_layers(scores, 2) == [1, 2]       # three 5s: the two earliest win
    assert top_k_layers(scores, 4) == [0, 1, 2, 4]
    assert top_k_layers(scores, 99) == [0, 1, 2, 3, 4]
    assert top_k_layers(scores, 0) == []
    assert top_k_layers(torch.zeros(4, dtype=torch.int64), 2) == [0, 1]


def test_module_granularity_groups_weight_and_bias():
    names = ["conv.weight", "conv.bias", "bn.weight", "bn.bias", "fc.weight"]
    layers = build_layers(names, "module")
    assert [(l.name, l.tensors) for l in layers] == [("conv", ("conv.weight", "conv.bias")),
                                                    ("bn", ("bn.weight", "bn.bias")), ("fc", ("fc.weight",))]
    assert [l.tensors for l in build_layers(names, "tensor")] == [(n,) for n in names]


def test_module_layer_scores_weight_and_bias_as_one_vector():
    layers = build_layers(["m.weight", "m.bias"], "module")
    # Weights alone conflict (cos -1), but the joint vectors (1,0,5) and (-1,0,5) agree: cos = 24/26 > 0.
    updates = [{"m.weight": torch.tensor([1.0, 0.0]), "m.bias": torch.tensor([5.0])},
               {"m.weight": torch.tensor([-1.0, 0.0]), "m.bias": torch.tensor([5.0])}]
    assert conflict_scores(stack_layer_updates(updates, layers), 0.0).tolist() == [0]
    tensor_layers = build_layers(["m.weight", "m.bias"], "tensor")
    assert conflict_scores(stack_layer_updates(updates, tensor_layers), 0.0).tolist() == [1, 0]
