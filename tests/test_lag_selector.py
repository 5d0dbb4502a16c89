"""LayerSelector: the three rules on hand-computed evidence, what happens without evidence, hysteresis,
invariance to the order clients upload in, history rows and state."""
import pytest
import torch

from flcore.lag import LagError, LagSettings, Layer, LayerSelector, hysteresis_choice, top_k_positive
from flcore.lag.conflict import count_below, layer_evidence_in_spans, pairwise_cosines

LAYERS = [Layer(name, (name,)) for name in ("a", "b", "c")]
PAIRS = torch.tensor([6, 6, 6])


def selector(**settings) -> LayerSelector:
    return LayerSelector(LagSettings(**settings), LAYERS)


def choices(sel: LayerSelector, rounds) -> list:
    return [sel.observe(None if c is None else torch.tensor(c), None if c is None else PAIRS, uploads=4)
            for c in rounds]


def test_every_round_takes_each_rounds_top_k_and_warmup_freezes_the_sum():
    rounds = [[5, 0, 0], [0, 1, 0], [0, 0, 9], [9, 0, 0]]
    assert choices(selector(top_k=1, schedule="every_round"), rounds) == [(0,), (1,), (2,), (0,)]
    # Warm-up over 2 scored rounds: sum [5, 1, 0] -> layer a, then frozen.
    assert choices(selector(top_k=1, schedule="warmup", warmup=2), rounds) == [(), (0,), (0,), (0,)]


def test_smoothed_weighs_rounds_by_their_pairs_and_decays_old_evidence():
    sel = selector(top_k=1, decay=0.5, margin=0.0)
    sel.observe(torch.tensor([3, 0, 0]), torch.tensor([3, 3, 3]), uploads=3)
    sel.observe(torch.tensor([0, 10, 0]), torch.tensor([45, 45, 45]), uploads=10)
    # a: (0.5 * 3 + 0) / (0.5 * 3 + 45) = 1.5 / 46.5;  b: 10 / 46.5
    assert torch.allclose(sel.rates(), torch.tensor([1.5, 10, 0], dtype=torch.float64) / 46.5)
    assert sel.personal == (1,)


def test_hysteresis_a_challenger_must_lead_by_more_than_the_margin():
    rates = torch.tensor([0.50, 0.55, 0.70, 0.0])
    assert hysteresis_choice(rates, current=(0,), k=1, margin=0.1) == (2,)      # 0.70 > 0.50 + 0.1
    assert hysteresis_choice(rates, current=(1,), k=1, margin=0.2) == (1,)      # 0.70 < 0.55 + 0.2
    assert hysteresis_choice(rates, current=(), k=2, margin=0.5) == (1, 2)      # free places fill at once
    assert hysteresis_choice(rates, current=(0, 1), k=2, margin=0.1) == (1, 2)  # the weakest gives way
    assert hysteresis_choice(rates, current=(0,), k=0, margin=0.1) == ()


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
    assert choices(sel, [None, [0, 3, 0], None, [0, 1, 0], [9, 0, 0]]) == [(), (), (), (1,), (1,)]
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


def test_state_dict_round_trip_continues_identically():
    rounds = [[1, 4, 0], [2, 0, 5], [0, 3, 3]]
    whole = selector(top_k=1)
    choices(whole, rounds)
    half = selector(top_k=1)
    choices(half, rounds[:1])
    restored = LayerSelector.from_state_dict(half.settings, half.state_dict())
    choices(restored, rounds[1:])
    assert restored.personal == whole.personal and torch.equal(restored.conflicts, whole.conflicts)
    assert [p.tolist() for p in restored.history["personal"]] == [p.tolist() for p in whole.history["personal"]]


def test_the_default_choice_does_not_depend_on_the_order_clients_upload_in():
    torch.manual_seed(0)
    updates = torch.randn(8, 30)
    updates[:4, :10] += 2.0      # layer 0: two opposed groups, many conflicts
    updates[4:, :10] -= 2.0
    updates[:, 10:] += 3.0       # layers 1 and 2: a common direction, few conflicts
    spans = [[(0, 10)], [(10, 20)], [(20, 30)]]
    results = []
    for order in (list(range(8)), [7, 3, 5, 0, 2, 6, 1, 4]):
        sel = selector(top_k=1)
        for _ in range(3):
            sel.observe(*layer_evidence_in_spans(updates[order], spans, 0.0), uploads=8)
        results.append((sel.personal, sel.rates()))
    assert results[0][0] == results[1][0] == (0,)
    assert torch.equal(results[0][1], results[1][1])


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
