"""FedFomo: first-order weights of downloaded models on a validation split, top-M by affinity."""
import copy

import numpy as np
import pytest
import torch

from flcore.aggregation import copy_into, named_tensors
from flcore.clients.clientfomo import fomo_weights
from utils.errors import ConfigError
from utils.result_utils import read_results
from helpers import assert_lag_composes, in_use, original_and_restored_twin, play_round, server_for, train, results_file


def test_weight_formula_on_a_hand_made_case():
    raw, normalised = fomo_weights(1.0, torch.tensor([0.5, 1.5, 0.8, 0.9], dtype=torch.float64),
                                   torch.tensor([0.5, 1.0, 0.0, 2.0], dtype=torch.float64))
    # (1 - 0.5) / 0.5, (1 - 1.5) / 1, identical model -> 0, (1 - 0.9) / 2
    assert torch.allclose(raw, torch.tensor([1.0, -0.5, 0.0, 0.05], dtype=torch.float64))
    assert torch.allclose(normalised, torch.tensor([1 / 1.05, 0.0, 0.0, 0.05 / 1.05], dtype=torch.float64))
    raw, normalised = fomo_weights(0.2, torch.tensor([0.5, 0.9], dtype=torch.float64),
                                   torch.tensor([1.0, 2.0], dtype=torch.float64))
    assert (raw < 0).all() and not normalised.any()  # no download helps: nothing is taken


def snapshot(model):
    return {n: t.detach().clone() for n, t in named_tensors(model).items()}


def validation_loss(model, data):
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model.eval()(data.x), data.y).double())


def test_client_combines_the_downloads_it_gains_from_and_keeps_its_own_model_otherwise(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedFomo")
    client = server.clients[0]
    untrained = snapshot(in_use(client).model)
    play_round(server)  # every client now holds its own trained model
    n = len(client.train_data) + len(client.validation_data)
    assert len(client.validation_data) == int(0.2 * n)  # the last 20% is held out, the rest trains
    # Client 0 goes back to its untrained model and downloads trained ones (its own among them) and
    # one that only hurts.
    sources = server.clients[:4]
    states = [snapshot(in_use(c).model) for c in sources]
    states.append({n: t + 3 * torch.randn(t.shape, generator=torch.Generator().manual_seed(0))
                   for n, t in untrained.items()})
    copy_into(client.model, untrained)
    old_loss = validation_loss(client.model, client.validation_data)
    raw = []
    for state in states:
        probe = copy.deepcopy(client.model)
        copy_into(probe, state)
        distance = torch.sqrt(sum(((state[n] - untrained[n]) ** 2).sum() for n, _ in client.model.named_parameters()))
        raw.append((old_loss - validation_loss(probe, client.validation_data)) / float(distance))
    positive = np.maximum(raw, 0)
    assert positive.sum() > 0 and (positive == 0).any(), "the case must weigh, drop and combine"
    expected = {name: sum(w / positive.sum() * s[name] for w, s in zip(positive, states)) for name in states[0]}
    ids = [c.id for c in sources] + [5]
    got_raw = client.combine_downloads(ids, states)
    assert np.allclose(got_raw, raw, rtol=1e-4) and not client.kept_own_model
    assert client.download_weights == {i: pytest.approx(w, rel=1e-4) for i, w in zip(ids, raw)}
    for name, tensor in named_tensors(client.model).items():
        assert torch.allclose(tensor, expected[name], atol=1e-6), name

    # Downloads that only hurt leave the model as it was.
    before = snapshot(client.model)
    noisy = [{n: t + 3 * torch.randn(t.shape, generator=torch.Generator().manual_seed(i)) for n, t in before.items()}
             for i in range(2)]
    weights = client.combine_downloads([4, 5], noisy)
    assert all(w < 0 for w in weights) and client.kept_own_model
    assert all(torch.equal(t, before[n]) for n, t in named_tensors(client.model).items())


def test_server_sends_the_top_m_by_affinity_and_adds_the_raw_weights_to_it(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedFomo", "-M", "2")
    play_round(server)  # round 0: nothing stored yet, every client keeps its own model
    assert all(m is not None for m in server.stored_models)
    server.affinity[0] = [9.0, 1.0, 5.0, 0.5, 4.0, -2.0]
    assert server.downloads_for(0) == [2, 4]  # never itself, highest affinity first
    server.stored_models[2] = None
    assert server.downloads_for(0) == [4, 1]  # only clients whose upload is stored
    server.stored_models[2] = copy.deepcopy(server.clients[2].module_tensors())
    affinity = server.affinity.copy()
    play_round(server)
    for client_id in server.uploader_ids():
        weights = server.clients[client_id].download_weights
        assert len(weights) == 2 and client_id not in weights
        for j, w in weights.items():
            assert server.affinity[client_id, j] == pytest.approx(affinity[client_id, j] + w)
        stored = server.stored_models[client_id]
        assert all(torch.equal(stored[n], t) for n, t in server.clients[client_id].module_tensors().items())


def test_state_survives_export_and_import(data_dir, tmp_path):
    original, twin = original_and_restored_twin(data_dir, tmp_path, "-algo", "FedFomo", "-jr", "0.5",
                                                rounds_before=2)
    assert np.array_equal(original.affinity, twin.affinity)
    for a, b in zip(original.clients, twin.clients):
        assert all(torch.equal(p, q) for p, q in zip(in_use(a).model.parameters(), in_use(b).model.parameters()))


def test_fedfomo_plus_lag_keeps_personal_layers(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedFomo+LAG", "--lag_top_k", "2")
    play_round(server)  # so that the composition check's broadcast really combines stored models
    assert_lag_composes(server, k=2)
    assert not all(c.kept_own_model for c in server.selected_clients)


def test_m_out_of_range_is_refused_by_name(data_dir, tmp_path):
    with pytest.raises(ConfigError, match="-M/--M"):
        server_for(data_dir, tmp_path, "-algo", "FedFomo", "-M", "0")


def test_three_rounds_end_to_end(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedFomo", "-gr", "2")
    train(server)
    arrays, _ = read_results(results_file(server))
    assert len(arrays["rs_test_acc"]) == 3 and arrays["rs_test_acc"][-1] > 0.5  # 4 classes: chance 0.25
    assert all(torch.isfinite(torch.as_tensor(arrays["rs_train_loss"])))
    kept = arrays["rs_fomo_kept_own"]
    assert len(kept) == 3 and kept[0] == 1.0 and kept[1] < 1.0  # nothing to download in round 0
