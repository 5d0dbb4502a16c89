"""IFCA: each client takes the cluster model of lowest loss on its own data, and each cluster model is the
average of its own uploads only."""
import copy
import math

import numpy as np
import pytest
import torch

from flcore.aggregation import named_tensors
from flcore.clustering import lowest_loss
from flcore.exchange import ClientUpdate
from flcore.registry import UnknownAlgorithmError, resolve
from flcore.servers.serverifca import redrawn_state
from utils.errors import ConfigError
from utils.result_utils import read_results
from helpers import (in_use, original_and_restored_twin, server_for, state_equal, train, train_and_compare,
                     training_loss_of, results_file)


def test_lowest_loss_takes_the_smallest_ties_to_the_lower_index_and_never_a_nan():
    assert lowest_loss([0.7, 0.2, 0.5]) == 1
    assert lowest_loss([0.3, 0.2, 0.2]) == 1
    assert lowest_loss([float("nan"), 2.0, 1.0]) == 2
    assert lowest_loss([float("nan"), float("nan")]) == 0


def constant_predictor(model_state, log_probabilities):
    """``model_state`` with every tensor zero but the head's bias: the same logits for every input."""
    state = {name: torch.zeros_like(t) for name, t in model_state.items()}
    state["head.bias"] = log_probabilities.clone()
    return state


def test_a_client_chooses_the_cluster_model_of_lowest_loss_on_its_own_data(data_dir, tmp_path):
    """Models predicting one fixed distribution q for every input: their loss on a client whose labels
    have proportions p is the cross-entropy -sum_c p_c log q_c, lowest for q = p itself."""
    server = server_for(data_dir, tmp_path, "-algo", "IFCA", "-ncs", "3")
    client, other = server.clients[0], server.clients[1]
    template = named_tensors(in_use(client).model)

    def proportions(c):
        counts = torch.bincount(c.train_data.y, minlength=4).double() + 0.5  # no zero: a finite log
        return counts / counts.sum()

    own, theirs = proportions(client), proportions(other)
    assert not torch.allclose(own, theirs)
    candidates = [constant_predictor(template, torch.zeros(4)), constant_predictor(template, theirs.log().float()),
                  constant_predictor(template, own.log().float())]
    observed = torch.bincount(client.train_data.y, minlength=4).double() / len(client.train_data.y)
    expected = [float(-(observed * torch.log_softmax(c["head.bias"].double(), 0)).sum()) for c in candidates]
    assert expected[0] == pytest.approx(math.log(4))
    assert client.cluster_losses(candidates) == pytest.approx(expected, rel=1e-5)
    assert client.choose_cluster(candidates) == 2 == int(np.argmin(expected))
    assert state_equal(named_tensors(client.model), candidates[2])  # it holds what it chose
    assert client.choose_cluster([candidates[1], candidates[2], candidates[2]]) == 1  # a tie: the lower index
    assert client.upload().extras == {"cluster": 1}


def place(server, choices):
    """Clients ``choices`` (id -> cluster) take the cluster model given, as if they had chosen it."""
    for client_id, cluster in choices.items():
        client = server.clients[client_id]
        client.cluster = cluster
        client.set_parameters(server.cluster_models[cluster])
        server.chosen[client_id] = cluster
    server.selected_clients = [server.clients[i] for i in sorted(choices)]


def test_each_cluster_averages_its_own_uploads_and_a_cluster_without_any_is_unchanged(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "IFCA", "-ncs", "3")
    before = copy.deepcopy(server.cluster_models)
    place(server, {0: 0, 1: 2, 2: 0, 3: 2, 4: 2})
    server.train_clients(server.selected_clients)
    server.receive_models()
    server.aggregate_parameters()
    for cluster, members in ((0, [0, 2]), (2, [1, 3, 4])):
        clients = [server.clients[i] for i in members]
        total = sum(c.train_samples for c in clients)
        for name, value in server.cluster_models[cluster].items():
            expected = sum(named_tensors(in_use(c).model)[name] * (c.train_samples / total) for c in clients)
            assert torch.allclose(value, expected, atol=1e-6), (cluster, name)
    assert state_equal(server.cluster_models[1], before[1])  # nobody chose it
    assert not state_equal(server.cluster_models[0], before[0])


def test_every_client_is_evaluated_with_the_cluster_it_would_choose_and_the_choices_are_recorded(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "IFCA", "-ncs", "3", "-jr", "0.5", "-gr", "2")
    train(server)
    recorded = read_results(results_file(server))[0]["cluster_of_client"]
    assert recorded.shape == (3, 6) and recorded.dtype.kind == "i" and set(recorded.ravel()) <= {0, 1, 2}
    # One more evaluation on the trained cluster models, against every choice recomputed by hand.
    server.selected_clients = server.select_clients()
    server.send_models()
    server.evaluate()
    chosen = server.history["cluster_of_client"][-1]
    for client in server.clients:
        losses = [training_loss_of(client, state) for state in server.cluster_models]
        assert chosen[client.id] == lowest_loss(losses), client.id
        assert state_equal(named_tensors(client.model), server.cluster_models[chosen[client.id]])
    assert len(set(chosen)) > 1  # the check covers more than one cluster
    # A client receives its choice as its payload: the clients that chose one cluster share one copy of it.
    with server.sending():
        payloads = {c.id: server.payload(c.id) for c in server.clients}
    for a in server.clients:
        for b in server.clients:
            assert (payloads[a.id] is payloads[b.id]) == (chosen[a.id] == chosen[b.id])


def test_with_one_cluster_ifca_is_fedavg_bit_for_bit(data_dir, tmp_path):
    ifca = server_for(data_dir, tmp_path / "ifca", "-algo", "IFCA", "-ncs", "1", "-jr", "0.5", "-gr", "2")
    fedavg = server_for(data_dir, tmp_path / "fedavg", "-algo", "FedAvg", "-jr", "0.5", "-gr", "2")
    train_and_compare(ifca, fedavg)
    assert state_equal(ifca.cluster_models[0], named_tensors(fedavg.global_model))


def test_cluster_models_start_apart_from_seeded_streams(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "IFCA")
    models = server.cluster_models
    assert len(models) == 4 and state_equal(models[0], named_tensors(server.global_model))
    for j in range(1, 4):
        assert all(not torch.equal(models[j][n], models[0][n]) for n in models[0] if n.endswith("weight")), j
    again = server_for(data_dir, tmp_path, "-algo", "IFCA")
    other_seed = server_for(data_dir, tmp_path, "-algo", "IFCA", "--seed", "1")
    assert all(state_equal(a, b) for a, b in zip(models, again.cluster_models))
    assert not state_equal(models[1], other_seed.cluster_models[1])
    generator = torch.get_rng_state()
    assert state_equal(redrawn_state(server.global_model, 5), redrawn_state(server.global_model, 5))
    assert torch.equal(torch.get_rng_state(), generator)  # the global generator is left alone


def test_weight_sharing_averages_the_base_over_every_cluster_and_the_heads_within_each(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "IFCA", "-ncs", "2", "--ifca_share_base")
    base = server.base_names()
    assert base and all(not n.startswith("head.") for n in base)
    assert state_equal(server.cluster_models[0], server.cluster_models[1], base)
    assert not torch.equal(server.cluster_models[0]["head.weight"], server.cluster_models[1]["head.weight"])
    place(server, {0: 0, 1: 1, 2: 1})
    server.train_clients(server.selected_clients)
    server.receive_models()
    server.aggregate_parameters()
    total = sum(server.clients[i].train_samples for i in (0, 1, 2))
    for name in base:
        expected = sum(named_tensors(in_use(server.clients[i]).model)[name] * (server.clients[i].train_samples / total)
                       for i in (0, 1, 2))
        assert torch.allclose(server.cluster_models[0][name], expected, atol=1e-6), name
        assert torch.equal(server.cluster_models[1][name], server.cluster_models[0][name]), name
    assert state_equal(server.cluster_models[0], named_tensors(server.clients[0].model), ["head.weight", "head.bias"])


def test_an_upload_naming_no_cluster_is_left_out_and_listed(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "IFCA", "-ncs", "2")
    client = in_use(server.clients[0])
    tensors = named_tensors(client.model)
    assert server.accepts(ClientUpdate(0, client.train_samples, tensors, extras={"cluster": 1}))
    for wrong in (2, -1, None, True):
        assert not server.accepts(ClientUpdate(0, client.train_samples, tensors, extras={"cluster": wrong}))
    assert [r["reason"] for r in server.rejected_updates] == [
        f"its cluster index {w!r} is not one of 0 .. 1" for w in (2, -1, None, True)]


def test_ifca_refuses_lag_and_a_share_base_without_a_head(data_dir, tmp_path):
    with pytest.raises(UnknownAlgorithmError, match="IFCA already personalises by client cluster"):
        resolve("IFCA+LAG")
    from helpers import server_of_class
    with pytest.raises(ConfigError, match="--ifca_share_base needs a model split into base and head"):
        server_of_class(resolve("IFCA")[0], data_dir, tmp_path, "-algo", "IFCA", "--ifca_share_base", head_split=False)


def test_state_survives_export_and_import(data_dir, tmp_path):
    original, twin = original_and_restored_twin(data_dir, tmp_path, "-algo", "IFCA", "-jr", "0.5", rounds_before=2)
    assert all(state_equal(a, b) for a, b in zip(original.cluster_models, twin.cluster_models))
    for a, b in zip(original.clients, twin.clients):
        assert state_equal(named_tensors(in_use(a).model), named_tensors(in_use(b).model))


def test_the_same_seed_gives_the_same_clusters_on_label_groups(digits_groups_dir, tmp_path):
    """Digits-iid-lg4: client i in label group i % 4; two runs of three rounds choose identically."""
    choices = []
    for name in ("first", "second"):
        server = server_for(digits_groups_dir, tmp_path / name, "-algo", "IFCA", "-data", "Digits-iid-lg4", "-nc", "8",
                            "-m", "DNN", "-gr", "2")
        train(server)
        choices.append(read_results(results_file(server))[0]["cluster_of_client"])
    assert choices[0].shape == (3, 8) and len(set(choices[0][-1])) > 1
    assert np.array_equal(choices[0], choices[1])
