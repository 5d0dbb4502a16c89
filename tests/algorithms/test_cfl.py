"""CFL: a cluster splits when its clients' mean update vanishes while some client's does not (by default
relative to the clients' own updates, or by the authors' absolute bounds), in two by the cosine similarity of
their updates; the parts start from the parent's model."""
import copy
import itertools

import numpy as np
import pytest
import torch

from flcore.aggregation import named_tensors
from app.build import prepare
from app.options import parse_args, unused_flag_warnings
from flcore.clustering import (RelativeSplitRule, SplitRule, bipartition, cosine_matrix, effective_uploads,
                               largest_cross_similarity, max_update_norm, mean_update_norm, orthogonal_update_norm,
                               update_gram)
from flcore.registry import UnknownAlgorithmError, resolve
from utils.errors import ConfigError
from utils.result_utils import read_results
from helpers import (cli, in_use, original_and_restored_twin, play_round, server_for, state_equal, train,
                     train_and_compare, training_loss_of, results_file)

# Every round with at least 3 uploads splits: no warm-up, any mean update is small enough, any client's large.
ALWAYS_SPLIT = ("--cfl_rule", "absolute", "--cfl_warmup", "0", "--cfl_eps1", "1e9", "--cfl_eps2", "0")


def gram_of(updates, start=None):
    """The Gram matrix of 2-vectors ``updates``, given as models of two tensors started from ``start``."""
    start = start or {"a": torch.tensor([0.5]), "b": torch.tensor([[-1.0]])}
    states = [{"a": start["a"] + float(u[0]), "b": start["b"] + float(u[1])} for u in updates]
    return update_gram(states, start, ["a", "b"])


def test_split_rule_on_hand_computed_norms():
    rule = SplitRule(eps1=0.5, eps2=2.0, warmup=2)
    # Two pairs of opposite updates: the mean update is 0, the largest has norm 3. A stationary point of the
    # cluster that is none of its clients': split (once the warm-up is over and with 3 uploads or more).
    gram = gram_of([(3.0, 0.0), (-3.0, 0.0), (0.0, 1.0), (0.0, -1.0)])
    assert torch.equal(gram, torch.tensor([[9.0, -9, 0, 0], [-9, 9, 0, 0], [0, 0, 1, -1], [0, 0, -1, 1]],
                                          dtype=torch.float64))
    mean, largest = mean_update_norm(gram, [0.25] * 4), max_update_norm(gram)
    assert (mean, largest) == (0.0, 3.0)
    assert rule.due(2, 4, mean, largest) and rule.due(7, 3, mean, largest)
    assert not rule.due(1, 4, mean, largest)   # in the warm-up
    assert not rule.due(2, 2, mean, largest)   # fewer than 3 uploads
    # Sample weights 1:1:2 give the mean (4, 0)/4 + (0, 3)/4 = (1, 0.75), of norm 1.25 >= eps1: no split.
    gram = gram_of([(4.0, 0.0), (0.0, 3.0), (0.0, 0.0)])
    assert mean_update_norm(gram, [0.25, 0.25, 0.5]) == pytest.approx(1.25) and max_update_norm(gram) == 4.0
    assert not rule.due(5, 3, 1.25, 4.0)
    # Jointly stationary and no client far from stationary (largest norm 1 <= eps2): no split.
    gram = gram_of([(1.0, 0.0), (-1.0, 0.0), (0.0, 0.5), (0.0, -0.5)])
    assert mean_update_norm(gram, [0.25] * 4) == 0.0 and max_update_norm(gram) == 1.0
    assert not rule.due(5, 4, 0.0, 1.0)


def norms_of(updates, weights):
    """What the split rules read of 2-vector updates: mean-update norm, largest update norm, orthogonal norm
    and effective uploads."""
    gram = gram_of(updates)
    return (mean_update_norm(gram, weights), max_update_norm(gram), orthogonal_update_norm(gram, weights),
            effective_uploads(weights))


def test_relative_split_rule_on_hand_computed_norms():
    rule = RelativeSplitRule(ratio=0.7, warmup=2)
    quarter = [0.25] * 4
    # Two opposite pairs: the mean update is 0 while each is orthogonal to its pair's, so the mean would have
    # sqrt(9 + 9 + 1 + 1) / 4 had they been orthogonal: split (after the warm-up, with 3 uploads or more).
    norms = norms_of([(3.0, 0.0), (-3.0, 0.0), (0.0, 1.0), (0.0, -1.0)], quarter)
    assert norms == (0.0, 3.0, pytest.approx(20 ** 0.5 / 4), 4.0)
    assert rule.due(2, 4, *norms) and rule.due(9, 4, *norms)
    assert not rule.due(1, 4, *norms)   # in the warm-up
    # Two clients, or three whose samples make the mean one client's (effective uploads 1.5 for 8:1:1): no split.
    assert not rule.due(5, 2, *norms_of([(3.0, 0.0), (-3.0, 0.0)], [0.5, 0.5]))
    lopsided = norms_of([(0.1, 0.0), (-3.0, 0.0), (3.0, 0.0)], [0.8, 0.1, 0.1])  # mean (0.08, 0), ratio 0.19
    assert lopsided[0] < 0.7 * lopsided[2] and lopsided[3] == pytest.approx(1 / 0.66)
    assert not rule.due(5, 3, *lopsided)
    # One pair cancels, the other agrees: the mean (0, 0.5) is exactly as long as orthogonal updates' mean,
    # sqrt(1 + 1 + 1 + 1) / 4, so no ratio up to 1 splits.
    norms = norms_of([(1.0, 0.0), (-1.0, 0.0), (0.0, 1.0), (0.0, 1.0)], quarter)
    assert norms[0] == norms[2] == 0.5
    assert not RelativeSplitRule(ratio=1.0, warmup=0).due(5, 4, *norms)
    # The cancelling pair twice as long: 0.5 against sqrt(10) / 4, a ratio of sqrt(0.4) = 0.632.
    norms = norms_of([(2.0, 0.0), (-2.0, 0.0), (0.0, 1.0), (0.0, 1.0)], quarter)
    assert norms[0] / norms[2] == pytest.approx(0.4 ** 0.5)
    assert rule.due(5, 4, *norms) and not RelativeSplitRule(ratio=0.6, warmup=2).due(5, 4, *norms)
    # The bound itself: 0.8 x 0.5 = 0.4 is not below 0.4; nor are 3 effective uploads below 3.
    at = RelativeSplitRule(ratio=0.8, warmup=0)
    assert not at.due(0, 3, 0.4, 1.0, 0.5, 3.0) and at.due(0, 3, 0.39, 1.0, 0.5, 3.0)
    assert effective_uploads([120, 120, 120]) == 3.0 and not at.due(0, 3, 0.39, 1.0, 0.5, 2.99)
    # Nobody moved: nothing to split on.
    assert not RelativeSplitRule(ratio=1.0, warmup=0).due(3, 4, 0.0, 0.0, 0.0, 4.0)


def test_the_relative_rule_does_not_depend_on_the_updates_scale_and_the_absolute_rule_does():
    relative, absolute = RelativeSplitRule(ratio=0.8, warmup=0), SplitRule(eps1=0.05, eps2=0.3, warmup=0)
    cancelling = np.array([(1.0, 0.05), (-1.0, 0.0), (0.0, 1.0), (0.0, -1.0)])  # mean (0, 0.0125)
    agreeing = np.array([(1.0, 0.2), (0.8, -0.1), (1.1, 0.0), (0.9, 0.1)])     # mean (0.95, 0.05)
    scales = (1e-3, 0.1, 1.0, 10.0, 1e3)
    for updates, weights, splits in ((cancelling, [0.25] * 4, True), (agreeing, [0.25, 0.25, 0.3, 0.2], False)):
        assert [relative.due(1, 4, *norms_of(scale * updates, weights)) for scale in scales] == [splits] * 5
    # The absolute bounds hold at one scale only: a tenth of the updates is stationary for every client too
    # (largest norm below eps2), ten times them not stationary for the cluster (mean above eps1).
    assert [absolute.due(1, 4, *norms_of(scale * cancelling, [0.25] * 4)) for scale in scales] \
        == [False, False, True, False, False]


def test_the_rule_flags(data_dir, tmp_path):
    """The relative rule by default; the authors' absolute rule by --cfl_rule absolute, with its bounds as
    given; each rule's flags are named unread under the other."""
    assert server_for(data_dir, tmp_path / "relative", "-algo", "CFL").rule == RelativeSplitRule(ratio=0.8, warmup=5)
    absolute = server_for(data_dir, tmp_path / "absolute", "-algo", "CFL", "--cfl_rule", "absolute")
    assert absolute.rule == SplitRule(eps1=0.05, eps2=0.3, warmup=5)
    authors = ("--cfl_rule", "absolute", "--cfl_eps1", "0.4", "--cfl_eps2", "1.6", "--cfl_warmup", "20")
    assert server_for(data_dir, tmp_path / "authors", "-algo", "CFL", *authors).rule == SplitRule(0.4, 1.6, 20)
    argv = cli(data_dir, tmp_path, "-algo", "CFL", "--cfl_eps1", "0.4", "--cfl_ratio", "0.5")
    warnings = [w for w in unused_flag_warnings(parse_args(argv), argv) if w.startswith("--cfl")]
    assert warnings == ["--cfl_eps1 is not read by CFL, so it changes nothing in this run (only --cfl_rule "
                        "absolute reads it, and this run's is relative)"]
    argv = cli(data_dir, tmp_path, "-algo", "CFL", *authors, "--cfl_ratio", "0.5")
    assert [w.split(" is not read")[0] for w in unused_flag_warnings(parse_args(argv), argv)
            if w.startswith("--cfl")] == ["--cfl_ratio"]


@pytest.mark.parametrize("value", ["0", "-0.5", "1.5"])
def test_a_ratio_outside_0_1_is_refused_in_one_line(data_dir, tmp_path, value):
    with pytest.raises(ConfigError) as refused:
        prepare(parse_args(cli(data_dir, tmp_path, "-algo", "CFL", "--cfl_ratio", value)))
    assert str(refused.value) == f"--cfl_ratio (CFL's relative split bound) must be in (0, 1], got {float(value)}"


def test_the_relative_rule_splits_exactly_where_the_recorded_norms_say(digits_groups_dir, tmp_path):
    """Every cluster's row of a run on label groups (-jr 1: every member uploads): a split in that round and
    cluster iff the mean-update norm is below --cfl_ratio times the recorded orthogonal norm, on 3 effective
    uploads or more."""
    server = server_for(digits_groups_dir, tmp_path, "-algo", "CFL", "-data", "Digits-iid-lg4", "-nc", "8", "-m",
                        "DNN", "-jr", "1", "-gr", "4", "--cfl_warmup", "0", "--cfl_ratio", "0.95")
    train(server)
    arrays, _ = read_results(results_file(server))
    norms, orthogonal = arrays["cfl_update_norms"], arrays["cfl_orthogonal_norms"]
    clusters = arrays["cluster_of_client"]
    assert len(orthogonal) == len(norms) > 0 and (orthogonal > 0).all()
    samples = np.array([c.train_samples for c in server.clients])
    expected = []
    for (rnd, cluster, _, mean, _), orthogonal_norm in zip(norms, orthogonal):
        members = samples[clusters[int(rnd)] == cluster]  # each round's clusters, recorded before it trains
        if effective_uploads(members) >= 3 and mean < 0.95 * orthogonal_norm:
            expected.append((int(rnd), int(cluster)))
    assert [(s["round"], s["cluster"]) for s in server.splits] == expected
    assert 0 < len(expected) < len(norms)
    assert [s["orthogonal_norm"] for s in server.splits] == [
        o for (r, c, *_), o in zip(norms, orthogonal) if (int(r), int(c)) in expected]


def test_cosines_from_the_gram_matrix_with_a_zero_update():
    cosines = cosine_matrix(gram_of([(3.0, 0.0), (1.0, 1.0), (0.0, 0.0)]))
    assert np.allclose(cosines, [[1, 2 ** -0.5, 0], [2 ** -0.5, 1, 0], [0, 0, 1]])


# Complete linkage keeps {0, 1} and {2, 3} (merging 2 and 3 at 0.55 before anything reaches 1 and 2 at
# min(0.5, 0.6)); single linkage chains 2 onto {0, 1} (at 0.6) and cuts 3 off, the smallest possible
# largest cross similarity (0.55 against 0.6).
CHAIN = np.array([[1.0, 0.9, 0.5, 0.0],
                  [0.9, 1.0, 0.6, 0.1],
                  [0.5, 0.6, 1.0, 0.55],
                  [0.0, 0.1, 0.55, 1.0]])


def test_bipartition_of_two_blocks_and_of_a_chain():
    blocks = np.full((6, 6), -0.3)
    for part, inside in (([0, 2, 3], 0.85), ([1, 4, 5], 0.7)):
        blocks[np.ix_(part, part)] = inside
    blocks[2, 4] = blocks[4, 2] = 0.4  # the most similar cross pair stays below every pair inside a block
    np.fill_diagonal(blocks, 1.0)
    for linkage in ("complete", "single"):
        assert bipartition(blocks, linkage) == ([0, 2, 3], [1, 4, 5])
    assert bipartition(CHAIN) == ([0, 1], [2, 3])
    assert bipartition(CHAIN, "single") == ([0, 1, 2], [3])
    assert largest_cross_similarity(CHAIN, [0, 1], [2, 3]) == 0.6
    assert largest_cross_similarity(CHAIN, [0, 1, 2], [3]) == 0.55


def test_single_linkage_is_the_optimal_bipartition_and_complete_matches_scipy():
    from scipy.cluster.hierarchy import linkage, to_tree
    from scipy.spatial.distance import squareform
    rng = np.random.default_rng(0)
    for _ in range(40):
        n = int(rng.integers(3, 8))
        v = rng.normal(size=(n, 4))
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        similarity = v @ v.T
        optimum = min(largest_cross_similarity(similarity, [i for i in range(n) if i in part],
                                               [i for i in range(n) if i not in part])
                      for k in range(1, n) for part in itertools.combinations(range(n), k))
        first, second = bipartition(similarity, "single")
        assert largest_cross_similarity(similarity, first, second) == pytest.approx(optimum)
        root = to_tree(linkage(squareform(1 - similarity, checks=False), method="complete"))
        parts = sorted([sorted(root.get_left().pre_order()), sorted(root.get_right().pre_order())])
        assert sorted(bipartition(similarity)) == parts


def parameter_vector(state, names):
    return torch.cat([state[n].detach().reshape(-1).double() for n in names])


def test_a_split_cuts_the_uploaders_by_their_updates_and_each_part_starts_from_the_parent(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "CFL", "-jr", "0.5", *ALWAYS_SPLIT)
    parent = copy.deepcopy(server.cluster_models[0])
    names = [n for n, _ in server.global_model.named_parameters()]
    play_round(server)
    uploaders = server.uploader_ids()
    assert len(uploaders) == 3 and len(server.cluster_models) == 2
    # The cut, from the updates written out: theta after training minus the parent's model.
    updates = np.stack([(parameter_vector(server.clients[i].module_tensors(), names)
                         - parameter_vector(parent, names)).numpy() for i in uploaders])
    unit = updates / np.linalg.norm(updates, axis=1, keepdims=True)
    first, second = bipartition(unit @ unit.T)
    parts = [[uploaders[i] for i in first], [uploaders[i] for i in second]]
    split, = server.splits
    assert (split["round"], split["cluster"], split["new_cluster"], split["uploaders"]) == (0, 0, 1, parts)
    # Each part: the parent's model moved by the sample-weighted mean of its own members' updates.
    for cluster, members in enumerate(parts):
        clients = [server.clients[i] for i in members]
        total = sum(c.train_samples for c in clients)
        for name in names:
            expected = parent[name] + sum((c.module_tensors()[name] - parent[name]) * (c.train_samples / total)
                                          for c in clients)
            assert torch.allclose(server.cluster_models[cluster][name], expected, atol=1e-6), (cluster, name)
        assert all(server.cluster_of[i] == cluster for i in members)
    # The parent's other clients join the part whose model has the lower loss on their training data.
    for client in server.clients:
        if client.id not in uploaders:
            losses = [training_loss_of(client, state) for state in server.cluster_models]
            assert server.cluster_of[client.id] == int(np.argmin(losses)), client.id

    # Members keep their clusters, and receive their cluster's model, in later rounds.
    assignment = list(server.cluster_of)
    server.rule = SplitRule(eps1=0.0, eps2=0.0, warmup=0)  # no more splits
    play_round(server)
    server.send_models()
    assert server.cluster_of == assignment
    for client in server.clients:
        assert state_equal(client.module_tensors(), server.cluster_models[assignment[client.id]])
    # That model is each client's payload: one frozen copy per cluster, shared by its clients.
    with server.sending():
        payloads = [server.payload(c.id) for c in server.clients]
    for a, b in itertools.combinations(range(len(server.clients)), 2):
        assert (payloads[a] is payloads[b]) == (assignment[a] == assignment[b]), (a, b)
    assert all(state_equal(payloads[i], server.cluster_models[assignment[i]]) for i in range(len(payloads)))


@pytest.mark.parametrize("linkage, parts", [("complete", [[0, 1], [2, 3]]), ("single", [[0, 1, 2], [3]])])
def test_cfl_linkage_chooses_the_bipartition(data_dir, tmp_path, linkage, parts):
    server = server_for(data_dir, tmp_path, "-algo", "CFL", "--cfl_linkage", linkage)
    members = [in_use(server.clients[i]).upload() for i in range(4)]
    server.split(0, members, CHAIN, mean_norm=0.0, max_norm=1.0)
    assert server.splits[-1]["uploaders"] == parts
    assert server.splits[-1]["largest_cross_similarity"] == largest_cross_similarity(CHAIN, *parts)
    assert server.cluster_of[:4] == [0 if i in parts[0] else 1 for i in range(4)]


def test_without_a_split_cfl_is_fedavg_bit_for_bit(data_dir, tmp_path):
    cfl = server_for(data_dir, tmp_path / "cfl", "-algo", "CFL", "-jr", "0.5", "-gr", "2", "--cfl_warmup", "100")
    fedavg = server_for(data_dir, tmp_path / "fedavg", "-algo", "FedAvg", "-jr", "0.5", "-gr", "2")
    (cfl_arrays, cfl_attrs), _ = train_and_compare(cfl, fedavg)
    assert state_equal(cfl.cluster_models[0], named_tensors(fedavg.global_model))
    assert cfl_arrays["cfl_split_rounds"].shape == (0,) and cfl_attrs["cfl_splits"] == []
    # One row of norms per round (one cluster): round, cluster, uploads, mean-update norm, largest norm.
    norms = cfl_arrays["cfl_update_norms"]
    assert norms.shape == (3, 5) and norms[:, :3].tolist() == [[0, 0, 3], [1, 0, 3], [2, 0, 3]]
    assert (norms[:, 3] <= norms[:, 4]).all() and (norms[:, 3] > 0).all()


def test_state_survives_export_and_import_after_a_split(data_dir, tmp_path):
    original, twin = original_and_restored_twin(data_dir, tmp_path, "-algo", "CFL", "-jr", "1", *ALWAYS_SPLIT)
    assert len(original.cluster_models) >= 3  # a split in each of the two rounds
    assert original.cluster_of == twin.cluster_of and original.splits == twin.splits
    assert original.update_norms == twin.update_norms
    assert all(state_equal(a, b) for a, b in zip(original.cluster_models, twin.cluster_models))


def test_cfl_refuses_lag():
    with pytest.raises(UnknownAlgorithmError, match="CFL already personalises by client cluster"):
        resolve("CFL+LAG")


def test_the_same_seed_gives_the_same_clusters_on_label_groups(digits_groups_dir, tmp_path):
    """Digits-iid-lg4: client i in label group i % 4; two runs of three rounds split identically."""
    records = []
    for name in ("first", "second"):
        server = server_for(digits_groups_dir, tmp_path / name, "-algo", "CFL", "-data", "Digits-iid-lg4", "-nc", "8",
                            "-m", "DNN", "-gr", "2", *ALWAYS_SPLIT)
        train(server)
        records.append(read_results(results_file(server)))
    (first, first_attrs), (second, second_attrs) = records
    assert first["cluster_of_client"].shape == (3, 8) and len(set(first["cluster_of_client"][-1])) > 1
    assert first["cfl_split_rounds"].tolist() == [s["round"] for s in first_attrs["cfl_splits"]] != []
    assert np.array_equal(first["cluster_of_client"], second["cluster_of_client"])
    assert first_attrs["cfl_splits"] == second_attrs["cfl_splits"]
