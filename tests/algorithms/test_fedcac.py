"""FedCAC: critical entries (top tau of |delta * theta|) from the customised model, the rest global."""
import copy

import pytest
import torch

from flcore.aggregation import named_tensors
from flcore.clients.clientcac import critical_mask
from utils.errors import ConfigError
from utils.result_utils import read_results
from helpers import assert_lag_composes, in_use, play_round, server_for, train, results_file


def test_the_mask_selects_the_top_tau_fraction_by_sensitivity_per_tensor():
    before = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    after = torch.tensor([[2.0, 1.0, -3.0, 1.5], [0.5, 1.0, 4.0, 0.0]])
    # |(after - before) * after| = [[2, 0, 12, 0.75], [0.25, 0, 12, 0]]
    assert critical_mask(before, after, 0.25).tolist() == [[False, False, True, False], [False, False, True, False]]
    assert critical_mask(before, after, 0.5).tolist() == [[True, False, True, True], [False, False, True, False]]
    # Zero sensitivity is never critical, even when tau asks for more; ties keep the earlier entry.
    assert critical_mask(before, after, 1.0).sum() == 5
    tied = critical_mask(torch.zeros(3), torch.tensor([1.0, -2.0, 2.0]), 0.34)  # sensitivities 1, 4, 4
    assert tied.tolist() == [False, True, False]
    assert not critical_mask(before, after, 0.1).any()  # int(0.1 * 8) = 0 entries


def customised_by_hand(server, trained, global_state, beta):
    """Overlaps, threshold and customised models computed pair by pair from the definitions."""
    clients = [in_use(c) for c in server.clients if c.id in server.previous_uploaders]
    flat = {c.id: torch.cat([m.reshape(-1) for m in c.critical_masks.values()]).float() for c in clients}
    overlap = {(i, j): 1 - (flat[i] - flat[j]).abs().sum() / (2 * flat[i].sum())
               for i in flat for j in flat if i != j}
    values = torch.stack(list(overlap.values()))
    mean, top = values.mean(), values.max()
    threshold = mean + server.current_round / beta * (top - mean)
    expected = {}
    for c in clients:
        group = [c.id] + [j for j in flat if j != c.id and overlap[(c.id, j)] >= threshold]
        expected[c.id] = {}
        for name, mask in c.critical_masks.items():
            customised = torch.stack([trained[j][name] for j in group]).mean(0)
            expected[c.id][name] = torch.where(mask, customised, global_state[name])
        expected[c.id]["group"] = group
    return expected, float(threshold)


@pytest.mark.parametrize("beta", [4.0, 0.5])
def test_critical_entries_come_from_the_customised_model_the_rest_from_the_global_average(beta, data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedCAC", "-tau", "0.3", "-bt", str(beta))
    play_round(server)
    server.current_round = 1
    trained = {c.id: copy.deepcopy(dict(in_use(c).model.named_parameters())) for c in server.clients}
    global_state = copy.deepcopy(named_tensors(server.global_model))
    expected, threshold = customised_by_hand(server, trained, global_state, beta)
    server.send_models()
    assert server.history["rs_cac_threshold"][-1] == pytest.approx(threshold)
    for client in server.clients:
        client.check_out()
        for name, param in client.model.named_parameters():
            assert torch.allclose(param, expected[client.id][name], atol=1e-7), (client.id, name)
            mask = client.critical_masks[name]
            assert torch.equal(param[~mask], global_state[name][~mask])
    groups = [len(expected[c.id]["group"]) for c in server.clients]
    if beta == 4.0:  # a low threshold: some clients share their critical entries with others
        assert max(groups) > 1
    else:  # threshold above every overlap: critical entries stay exactly the client's own
        assert groups == [1] * len(groups)
        for client in server.clients:
            for name, param in client.model.named_parameters():
                mask = client.critical_masks[name]
                assert torch.equal(param[mask], trained[client.id][name][mask])


def test_clients_that_did_not_upload_keep_their_critical_entries(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedCAC", "-tau", "0.3", "-bt", "4", "-jr", "0.5")
    play_round(server)
    play_round(server)
    absent = [c for c in server.clients if in_use(c).critical_masks and c.id not in server.previous_uploaders]
    assert absent
    own = {c.id: copy.deepcopy(dict(c.model.named_parameters())) for c in absent}
    global_state = named_tensors(server.global_model)
    server.send_models()
    for client in absent:
        client.check_out()
        for name, param in client.model.named_parameters():
            mask = client.critical_masks[name]
            assert torch.equal(param[mask], own[client.id][name][mask])
            assert torch.equal(param[~mask], global_state[name][~mask])


def test_state_survives_export_and_import(data_dir, tmp_path):
    flags = ("-algo", "FedCAC", "-tau", "0.3", "-bt", "4", "-jr", "0.5")
    original = server_for(data_dir, tmp_path, *flags)
    play_round(original)
    original.current_round = 1
    play_round(original)
    torch.save(original.get_state(), tmp_path / "state.pt")
    twin = server_for(data_dir, tmp_path, *flags, "--seed", "7")
    twin.set_state(torch.load(tmp_path / "state.pt", weights_only=True))
    assert twin.previous_uploaders == original.previous_uploaders
    for server in (original, twin):
        server.current_round = 2
        play_round(server)
    for a, b in zip(original.clients, twin.clients):
        a.check_out()
        b.check_out()
        assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
        assert all(torch.equal(a.critical_masks[n], b.critical_masks[n]) for n in a.critical_masks)


def test_fedcac_plus_lag_keeps_personal_layers_and_the_masks(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedCAC+LAG", "-tau", "0.3", "-bt", "4", "--lag_top_k", "2")
    assert_lag_composes(server, k=2, private=lambda client: dict(client.critical_masks))


def test_flags_out_of_range_are_refused_by_name(data_dir, tmp_path):
    with pytest.raises(ConfigError, match="-bt/--beta"):
        server_for(data_dir, tmp_path, "-algo", "FedCAC", "-bt", "0")  # PFLlib's default beta 0 divides by zero
    with pytest.raises(ConfigError, match=r"-tau/--tau .* \(0, 1\]"):
        server_for(data_dir, tmp_path, "-algo", "FedCAC", "-bt", "5", "-tau", "1.5")


def test_three_rounds_end_to_end(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedCAC", "-gr", "2", "-tau", "0.5", "-bt", "2")
    train(server)
    arrays, _ = read_results(results_file(server))
    assert len(arrays["rs_test_acc"]) == 3 and arrays["rs_test_acc"][-1] > 0.5  # 4 classes: chance 0.25
    assert all(torch.isfinite(torch.as_tensor(arrays["rs_train_loss"])))
    threshold = arrays["rs_cac_threshold"]
    assert len(threshold) == 3 and torch.isnan(torch.as_tensor(threshold[0])) and threshold[2] > threshold[1]
    assert len(arrays["rs_cac_collaborators"]) == 3
