"""Partitioners: every sample assigned once, class budgets, minimum sizes, bounded retries."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataset.utils.partition import (PartitionError, least_samples, partition, partition_dir,
                                     partition_pat, split_train_test)


def labels_for(num_classes, per_class, seed=0):
    rng = np.random.default_rng(seed)
    return rng.permutation(np.repeat(np.arange(num_classes), per_class))


def assert_exact_cover(parts, n):
    joined = np.concatenate(parts)
    assert len(joined) == n
    assert np.array_equal(np.sort(joined), np.arange(n))


@settings(max_examples=30, deadline=None)
@given(scheme=st.sampled_from(["iid", "pat", "dir", "exdir"]), clients=st.integers(2, 12),
       classes=st.integers(2, 8), seed=st.integers(0, 10_000), balance=st.booleans())
def test_every_sample_is_assigned_exactly_once(scheme, clients, classes, seed, balance):
    y = labels_for(classes, 60, seed)
    try:
        parts = partition(y, clients, scheme, np.random.default_rng(seed), num_classes=classes,
                          class_per_client=min(2, classes), alpha=0.5, balance=balance, max_tries=50)
    except PartitionError as err:
        assert "--" in str(err)  # the error names a flag to change
        return
    assert len(parts) == clients
    assert_exact_cover(parts, len(y))


def test_pat_respects_class_budget():
    y = labels_for(10, 100)
    parts = partition_pat(y, 20, 10, 2, balance=False, rng=np.random.default_rng(1))
    assert_exact_cover(parts, len(y))
    assert max(len(np.unique(y[p])) for p in parts) <= 2


def test_pat_balanced_gives_equal_chunks_per_class():
    y = np.repeat(np.arange(4), 12)  # 4 classes x 12 samples
    parts = partition_pat(y, 4, 4, 2, balance=True, rng=np.random.default_rng(0))
    # ceil(4*2/4) = 2 clients per class, 6 samples each; each client gets 2 classes -> 12 samples.
    assert [len(p) for p in parts] == [12, 12, 12, 12]


def test_pat_with_too_few_clients_for_the_classes_is_refused():
    # 5 clients x 1 class: ceil(5/4) = 2 clients per class, so class 3 finds every budget spent.
    y = labels_for(4, 20)
    with pytest.raises(PartitionError, match="--num-clients or --class-per-client"):
        partition_pat(y, 5, 4, 1, balance=False, rng=np.random.default_rng(0))


def test_iid_gives_every_client_every_class():
    y = labels_for(5, 40)
    parts = partition(y, 4, "iid", np.random.default_rng(0), num_classes=5, balance=True)
    assert all(len(np.unique(y[p])) == 5 for p in parts)


def test_dirichlet_holds_the_minimum_size():
    y = labels_for(10, 200)
    parts = partition_dir(y, 20, 10, 0.3, np.random.default_rng(3))
    assert min(len(p) for p in parts) >= least_samples(len(y), 20)
    assert_exact_cover(parts, len(y))


def test_dirichlet_fails_with_a_clear_message_instead_of_looping():
    y = labels_for(10, 10)  # 100 samples, 50 clients: a size floor of 40 is impossible
    with pytest.raises(PartitionError) as err:
        partition_dir(y, 50, 10, 0.01, np.random.default_rng(0), min_size=40, max_tries=20)
    message = str(err.value)
    assert "alpha=0.01" in message and "num_clients=50" in message and "--alpha" in message


def test_small_alpha_is_more_skewed_than_large_alpha():
    y = labels_for(10, 300)

    def mean_classes(alpha):
        parts = partition_dir(y, 10, 10, alpha, np.random.default_rng(0), min_size=1)
        return np.mean([len(np.unique(y[p])) for p in parts])
    assert mean_classes(0.1) < mean_classes(100.0)


def test_train_test_split_is_a_disjoint_three_to_one_cut():
    idx = np.arange(100, 140)
    train, test = split_train_test(idx, np.random.default_rng(0))
    assert len(train) == 30 and len(test) == 10
    assert set(train).isdisjoint(test) and set(train) | set(test) == set(idx)


def test_unknown_scheme_and_bad_alpha_are_refused():
    y = labels_for(3, 10)
    with pytest.raises(PartitionError, match="unknown partition"):
        partition(y, 2, "weird", np.random.default_rng(0), num_classes=3)
    with pytest.raises(PartitionError, match="--alpha"):
        partition(y, 2, "dir", np.random.default_rng(0), num_classes=3, alpha=0.0)
