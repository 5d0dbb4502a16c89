"""CFL: a cluster splits when its clients' mean update vanishes while some client's does not, in two by the
cosine similarity of their updates; the parts start from the parent's model."""
import copy
import itertools

import numpy as np
import pytest
import torch

from flcore.aggregation import named_tensors
from flcore.clustering import (SplitRule, bipartition, cosine_matrix, largest_cross_similarity, max_update_norm,
                               mean_update_norm, update_gram)
from flcore.registry import UnknownAlgorithmError, resolve
from utils.result_utils import read_results
from helpers import (in_use, original_and_restored_twin, play_round, server_for, state_equal, train, train_and_compare,
                     training_loss_of, results_file)

# Every round with at least 3 uploads splits: no warm-up, any mean update is small enough, any client's large.
ALWAYS_SPLIT = ("--cfl_warmup", "0", "--cfl_eps1", "1e9", "--cfl_eps2", "0")


def gram_of(updates, start=None):
    """The Gram matrix of 2-vectors ``updates``, given as models of two tensors started from ``start``."""
    start = start or {"a": torch.tensor([0.5]), "b": torch.tensor([[-1.0]])}
    states = [{"a": start["a"] + u[0], "b": start["b"] + u[1]} for u in updates]
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
