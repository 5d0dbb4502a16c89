"""LayerSelector: the three rules on hand-computed evidence, what happens without evidence, the evidence a
personal layer needs to give way, invariance to the order clients upload in, history rows and state."""
import math

import pytest
import torch

from flcore.lag import LagError, LagSettings, Layer, LayerSelector, evidence_choice, top_k_positive
from flcore.lag.conflict import count_below, evidence_from_cosines, layer_evidence_in_spans, pairwise_cosines
from flcore.lag.choice import paired_lead

LAYERS = [Layer(name, (name,)) for name in ("a", "b", "c")]


def pair_evidence(per_layer, xi=0.0):
    """LayerEvidence of one round from each layer's list of pair cosines (pairs in upper-triangle order)."""
    pairs = len(per_layer[0])
    m = next(n for n in range(2, 100) if n * (n - 1) // 2 == pairs)
    upper = torch.ones(m, m, dtype=torch.bool).triu(diagonal=1)
    counted = []
    for values in per_layer:
        cos = torch.eye(m, dtype=torch.float64)
        cos[upper] = torch.tensor(values, dtype=torch.float64)
        cos = cos + cos.triu(diagonal=1).T
        counted.append((cos, torch.ones(m, dtype=torch.bool)))
    return evidence_from_cosines(counted, xi)


def counts(conflicts, pairs=6):
    """A round whose layer l has ``conflicts[l]`` of ``pairs`` pairs at cosine -0.5, the rest at +0.5."""
    return pair_evidence([[-0.5] * c + [0.5] * (pairs - c) for c in conflicts])


def selector(**settings) -> LayerSelector:
    return LayerSelector(LagSettings(**settings), LAYERS)


def choices(sel: LayerSelector, rounds) -> list:
    return [sel.observe(None if r is None else (counts(r) if isinstance(r[0], int) else r), uploads=4)
            for r in rounds]


def test_every_round_takes_each_rounds_top_k_and_warmup_freezes_the_sum():
    rounds = [[5, 0, 0], [0, 1, 0], [0, 0, 6], [6, 0, 0]]
    assert choices(selector(top_k=1, schedule="every_round"), rounds) == [(0,), (1,), (2,), (0,)]
    # Warm-up over 2 scored rounds: sum [5, 1, 0] -> layer a, then frozen.
    assert choices(selector(top_k=1, schedule="warmup", warmup=2), rounds) == [(), (0,), (0,), (0,)]


def test_smoothed_ranks_by_the_decayed_mean_cosine_over_the_pairs():
    sel = selector(top_k=1, decay=0.5)
    # Round 1 (3 pairs): a at -0.9 on every pair, b at -0.1, c at +0.2.
    sel.observe(pair_evidence([[-0.9] * 3, [-0.1] * 3, [0.2] * 3]), uploads=3)
    assert sel.personal == (0,)
    # Round 2 (45 pairs): b far below a. a: (0.5 * -2.7 + 45 * 0.1) / (0.5 * 3 + 45) = 3.15 / 46.5.
    sel.observe(pair_evidence([[0.1] * 45, [-0.8] * 45, [0.0] * 45]), uploads=10)
    means = sel.mean_cosines()
    assert math.isclose(float(means[0]), 3.15 / 46.5)
    assert math.isclose(float(means[1]), (0.5 * -0.3 - 36.0) / 46.5)
    assert sel.personal == (1,)  # the paired gap of 0.9 on 45 pairs has no spread: an infinite lead


def test_the_paired_lead_is_the_mean_gap_over_its_standard_error():
    # b - a over three common pairs: 0.1, 0.2, 0.3 -> mean 0.2, variance 0.14 / 3 - 0.04, se sqrt(var / 3).
    ev = pair_evidence([[0.1, 0.2, 0.3], [0.2, 0.4, 0.6], [0.0, 0.0, 0.0]])
    expected = 0.2 / math.sqrt((0.14 / 3 - 0.04) / 3)
    assert math.isclose(paired_lead(ev.gap_sums, ev.gap_squares, ev.common_pairs, 0, 1), expected)
    assert math.isclose(paired_lead(ev.gap_sums, ev.gap_squares, ev.common_pairs, 1, 0), -expected)
    assert int(ev.common_pairs[0, 1]) == 3


def test_a_personal_layer_gives_way_only_on_enough_evidence():
    means = torch.tensor([0.0, -0.1, -0.2, 0.3], dtype=torch.float64)
    eligible = torch.tensor([True, True, True, False])
    lead = lambda a, b: {(2, 0): 3.0, (1, 0): 5.0, (2, 1): 1.0}.get((a, b), 0.0)  # noqa: E731
    choose = lambda current, k, margin, m=means: evidence_choice(m, eligible, lead, current, k, margin, 0.0)  # noqa
    assert choose((0,), 1, 2.0) == (2,)       # c leads a by 3 > 2
    assert choose((0,), 1, 4.0) == (1,)       # only b's lead of 5 is above 4
    assert choose((1,), 1, 2.0) == (1,)       # c leads b by 1 only
    assert choose((), 4, 0.0) == (0, 1, 2)    # d has no conflicting pair: never chosen
    assert choose((0,), 0, 0.0) == ()
    # A challenger whose updates agree on average (mean cosine above xi) displaces nothing, whatever its lead.
    agreeing = torch.tensor([0.5, 0.2, 0.1, 0.3], dtype=torch.float64)
    assert choose((0,), 1, 2.0, agreeing) == (0,)


def test_a_free_place_fills_at_once_with_the_layer_nearest_the_output_that_the_evidence_does_not_rule_out():
    """a is lowest; b lies 1 standard error above it, c 3 (d has no conflicting pair). Whatever the
    margin, a place fills in the round; the margin says how far the choice may move towards the output."""
    means = torch.tensor([-0.2, -0.1, 0.0, 0.3], dtype=torch.float64)
    eligible = torch.tensor([True, True, True, False])
    lead = lambda a, b: {(0, 1): 1.0, (0, 2): 3.0, (1, 2): 2.5}.get((a, b), 0.0)  # noqa: E731
    choose = lambda k, margin, m=means: evidence_choice(m, eligible, lead, (), k, margin, 0.0)  # noqa: E731
    assert choose(1, 0.5) == (0,)        # a is apart from b and c: a
    assert choose(1, 2.0) == (1,)        # b is within 2 of a, c is not: b
    assert choose(1, 4.0) == (2,)        # nothing is apart: the layer nearest the output
    # Two places: the second fills by the same rule among the layers left (b lowest, c 2.5 above it).
    assert choose(2, 2.0) == (0, 1)      # b first, then a (c is 3 above a)
    assert choose(2, 4.0) == (1, 2)      # c first, then b (a's lead over b is 1)
    # Layers whose updates agree on average fill a free place too: the base method's round is no safer.
    agreeing = torch.tensor([0.5, 0.2, 0.1, 0.3], dtype=torch.float64)
    assert choose(1, 2.0, agreeing) == (2,)


def test_a_tie_in_round_0_cannot_lock_a_layer_in():
    """Round 0: a and b conflict on all 6 pairs with the same cosines (a tie: b, nearer the output, is
    taken). From round 1 a's updates are further apart than b's, pair for pair: a must take b's place
    within a few rounds, and then hold it."""
    torch.manual_seed(0)
    sel = selector(top_k=1)
    tie = [-0.3, -0.2, -0.25, -0.1, -0.35, -0.15]
    history = [sel.observe(pair_evidence([tie, tie, [0.4] * 6]), uploads=4)]
    for _ in range(8):
        b = (torch.rand(6) * 0.3 - 0.35).tolist()
        a = [x - 0.1 - 0.05 * float(torch.rand(())) for x in b]
        history.append(sel.observe(pair_evidence([a, b, [0.4] * 6]), uploads=4))
    assert history[0] == (1,)
    assert (0,) in history[1:4]
    assert history[history.index((0,)):] == [(0,)] * (len(history) - history.index((0,)))
    # The rate of conflicting pairs alone could not tell them apart: both sit at 1.0 throughout.
    assert torch.allclose(sel.rates()[:2], torch.ones(2, dtype=torch.float64))


def test_noise_does_not_move_a_personal_layer():
    """Two layers whose cosines differ by pure noise, round after round: the first choice stays."""
    torch.manual_seed(1)
    sel = selector(top_k=1)
    picks = []
    for _ in range(30):
        base = (torch.rand(6) * 0.4 - 0.3)
        a = (base + 0.05 * torch.randn(6)).tolist()
        b = (base + 0.05 * torch.randn(6)).tolist()
        picks.append(sel.observe(pair_evidence([a, b, [0.4] * 6]), uploads=4))
    assert len(set(picks)) == 1


def test_no_evidence_personalises_nothing_new():
    zeros = [[0, 0, 0], [0, 0, 0]]
    for schedule in ("smoothed", "every_round"):
        assert choices(selector(top_k=2, schedule=schedule), zeros) == [(), ()]
        sel = selector(top_k=2, schedule=schedule)
        assert choices(sel, [[0, 4, 0], [0, 0, 0]]) == [(1,), (1,)]  # one conflicting layer: only it
    assert top_k_positive(torch.tensor([0, 0, 0]), 2) == ()


def test_warmup_counts_only_rounds_with_evidence_and_says_when_there_was_none():
    sel = selector(top_k=1, schedule="warmup", warmup=2)
    # Rounds with fewer than two uploads (None) do not count towards the warm-up.
    assert choices(sel, [None, [0, 3, 0], None, [0, 1, 0], [6, 0, 0]]) == [(), (), (), (1,), (1,)]
    silent = selector(top_k=1, schedule="warmup", warmup=2)
    choices(silent, [[0, 0, 0], [0, 0, 0]])
    assert silent.personal == () and "no layer is personalised" in silent.notes[0]


def test_unscored_rounds_still_get_their_row():
    sel = selector(top_k=1)
    choices(sel, [None, [0, 2, 0], None])
    arrays = sel.result_arrays(unscored_before=2)
    assert arrays["lag_scored"].tolist() == [False, False, False, True, False]
    assert arrays["lag_conflict_scores"].shape == arrays["lag_personal"].shape == (5, 3)
    assert arrays["lag_personal"][:, 1].tolist() == [False, False, False, True, True]
    cosines = arrays["lag_mean_cosines"]
    assert torch.isnan(cosines[[0, 1, 2, 4]]).all()
    assert torch.allclose(cosines[3], torch.tensor([0.5, (2 * -0.5 + 4 * 0.5) / 6, 0.5], dtype=torch.float64))


def test_state_dict_round_trip_continues_identically():
    rounds = [[1, 4, 0], [2, 0, 5], [0, 3, 3]]
    whole = selector(top_k=1)
    choices(whole, rounds)
    half = selector(top_k=1)
    choices(half, rounds[:1])
    restored = LayerSelector.from_state_dict(half.settings, half.state_dict())
    choices(restored, rounds[1:])
    assert restored.personal == whole.personal
    for name in ("conflicts", "pairs", "cosine_sums", "gap_sums", "gap_squares", "common_pairs"):
        assert torch.equal(getattr(restored, name), getattr(whole, name)), name
    assert [p.tolist() for p in restored.history["personal"]] == [p.tolist() for p in whole.history["personal"]]


def test_the_default_choice_does_not_depend_on_the_order_clients_upload_in():
    torch.manual_seed(0)
    updates = torch.randn(8, 30, dtype=torch.float64)
    updates[:4, :10] += 2.0      # layer 0: two opposed groups, many conflicts
    updates[4:, :10] -= 2.0
    updates[:, 10:] += 3.0       # layers 1 and 2: a common direction, few conflicts
    spans = [[(0, 10)], [(10, 20)], [(20, 30)]]
    results = []
    for order in (list(range(8)), [7, 3, 5, 0, 2, 6, 1, 4]):
        sel = selector(top_k=1)
        for _ in range(3):
            sel.observe(layer_evidence_in_spans(updates[order], spans, 0.0), uploads=8)
        results.append((sel.personal, sel.mean_cosines(), sel.rates()))
    assert results[0][0] == results[1][0] == (0,)
    assert torch.allclose(results[0][1], results[1][1]) and torch.equal(results[0][2], results[1][2])


def test_xi_minus_one_counts_nothing_even_for_exactly_opposite_updates():
    torch.manual_seed(3)
    vectors = torch.randn(200, 37)
    for v in vectors:
        cos, valid = pairwise_cosines(torch.stack([v, -v]))
        assert cos.min() >= -1.0
        assert count_below(cos, valid, -1.0) == 0
        assert count_below(cos, valid, -0.999) == 1


def test_settings_refuse_bad_decay_and_margin():
    with pytest.raises(LagError, match="--lag_decay must be in"):
        LagSettings(decay=0.0).check()
    with pytest.raises(LagError, match="--lag_margin must be >= 0"):
        LagSettings(margin=-0.1).check()
