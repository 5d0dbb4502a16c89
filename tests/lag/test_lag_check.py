"""--lag_share check: each client takes, of its own copy of a personal layer, its group's and everyone's,
the one of lowest loss on data it holds out of training."""
import copy

import pytest
import torch
from torch import nn

from flcore.lag import check as check_module
from flcore.lag.check import ALL, GROUP, MIN_CHECKS, OWN, CopyChoice, copy_losses, lead_over
from flcore.lag.settings import LagError
from helpers import original_and_restored_twin, play_round, results_file, server_for, state_equal, train
from utils.result_utils import read_results

CHECK = ("-algo", "FedLAG", "--lag_share", "check", "--val_ratio", "0.25")


# ----- the pure functions ---------------------------------------------------------------------------------
def test_copy_losses_are_the_losses_of_the_model_holding_each_copy_and_leave_it_unchanged():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    before = copy.deepcopy(model.state_dict())
    x, y = torch.randn(10, 3), torch.randint(0, 2, (10,))
    other = {"2.weight": torch.randn(2, 4), "2.bias": torch.randn(2)}
    batches = [(x[:6], y[:6]), (x[6:], y[6:])]
    own, missing, swapped = copy_losses(model, batches, [dict(model.named_parameters()), None, other])
    expected = copy.deepcopy(model)
    expected.load_state_dict({**before, **other})
    assert missing is None
    with torch.no_grad():
        direct = float(nn.functional.cross_entropy(model(x), y))
        expected_loss = float(nn.functional.cross_entropy(expected(x), y))
    assert own == pytest.approx(direct, rel=1e-6)
    assert swapped == pytest.approx(expected_loss, rel=1e-6)
    assert all(torch.equal(t, before[n]) for n, t in model.state_dict().items())


def test_the_lead_is_the_paired_mean_gap_over_its_standard_error_by_hand():
    sums, squares, weights = (torch.zeros(3, 3, dtype=torch.float64) for _ in range(3))
    # Three checks of group (1) against own (0): loss(own) - loss(group) = 0.2, 0.4, 0.3.
    for gap in (0.2, 0.4, 0.3):
        sums[1, 0] -= gap
        squares[1, 0] += gap ** 2
        weights[1, 0] += 1
    mean, variance = 0.3, (0.04 + 0.16 + 0.09) / 3 - 0.09
    assert lead_over(sums, squares, weights, 1, 0) == pytest.approx(mean / (variance / 3) ** 0.5)
    weights[1, 0] = MIN_CHECKS - 0.1
    assert lead_over(sums, squares, weights, 1, 0) == 0.0  # too few checks to judge
    assert lead_over(sums, squares, weights, 2, 0) == 0.0  # never compared


def test_a_client_moves_to_a_copy_only_on_evidence_and_does_not_move_back_on_a_near_tie():
    choice = CopyChoice(num_clients=2, decay=1.0, margin=2.0)
    choice.keep_layers([1])
    # The group's copy is better by 0.3 +- 0.05, everyone's worse: two checks are not yet enough.
    assert choice.observe(1, 0, [1.0, 0.70, 1.5]) == OWN
    assert choice.observe(1, 0, [0.9, 0.55, 1.4]) == OWN
    assert choice.observe(1, 0, [0.8, 0.50, 1.3]) == GROUP
    # Trained from the group's copy, its own is now as good: noise either way keeps it where it is.
    for own, group in ((0.40, 0.41), (0.38, 0.37), (0.36, 0.37), (0.35, 0.34)):
        assert choice.observe(1, 0, [own, group, 1.0]) == GROUP
    assert choice.of(1, 1) == OWN and choice.of(0, 0) == OWN  # no evidence, or not a personal layer
    assert choice.end_round(3).tolist() == [[-1, -1], [GROUP, OWN], [-1, -1]]
    choice.keep_layers([2])  # layer 1 returns to shared: its evidence goes with it
    assert choice.of(1, 0) == OWN and set(choice.choice) == {2}


def test_a_copy_with_no_spread_in_its_lead_moves_the_client_after_enough_checks():
    choice = CopyChoice(num_clients=1, decay=0.9, margin=2.0)
    choice.keep_layers([0])
    # Everyone's copy is better by exactly 0.1 every time (no spread): moved once the checks weigh 2.5.
    assert [choice.observe(0, 0, [1.0, None, 0.9]) for _ in range(4)] == [OWN, OWN, ALL, ALL]


def test_a_client_reads_its_groups_evidence_with_its_own():
    choice = CopyChoice(num_clients=3, decay=1.0, margin=2.0)
    choice.keep_layers([0])
    # Each client checks once: the group's copy is better by 0.2, 0.3, 0.25. Alone, one check is too few to
    # move; client 2 reads the three checks of its group {0, 1, 2}: lead 0.25 / (0.0408 / sqrt 3) > 2.
    assert choice.observe(0, 0, [1.0, 0.8, None]) == OWN
    assert choice.observe(0, 1, [1.0, 0.7, None]) == OWN
    assert choice.observe(0, 2, [1.0, 0.75, None], pool=[0, 1]) == GROUP
    assert choice.of(0, 0) == OWN  # the others move when they are next checked
    assert choice.observe(0, 0, [0.9, 0.7, None], pool=[1, 2]) == GROUP


def test_a_check_needs_the_own_copy_and_a_saved_state_of_another_shape_is_refused():
    choice = CopyChoice(num_clients=2, decay=0.9, margin=2.0)
    choice.keep_layers([0])
    with pytest.raises(ValueError, match="own copy"):
        choice.observe(0, 0, [None, 1.0, 1.0])
    state = choice.state_dict()
    with pytest.raises(ValueError, match="shape"):
        CopyChoice(num_clients=3, decay=0.9, margin=2.0).load_state_dict(state)


# ----- on a server ----------------------------------------------------------------------------------------
def test_without_held_out_data_the_check_is_refused_in_one_line(data_dir, tmp_path):
    with pytest.raises(LagError, match="--val_ratio"):
        server_for(data_dir, tmp_path, "-algo", "FedLAG", "--lag_share", "check")


def test_each_client_receives_the_copy_it_took_and_checks_on_held_out_data_only(data_dir, tmp_path, monkeypatch):
    server = server_for(data_dir, tmp_path, *CHECK, "-gr", "3")
    checked = []
    real = check_module.copy_losses

    def recording(model, batches, copies):
        batches = list(batches)
        checked.append(sum(int(y.shape[0]) for _, y in batches))
        return real(model, batches, copies)
    monkeypatch.setattr("flcore.lag.checked_copies.copy_losses", recording)
    play_round(server)  # nothing aggregated before it: no check
    assert checked == []
    play_round(server)
    held_out = sorted(len(c.val_data) for c in server.selected_clients) * len(server.lag_personal)
    assert sorted(checked) == held_out
    # Force the choices: client 0 takes everyone's copy, the others keep their own.
    copies = server.lag_check
    layer = server.lag_personal[0]
    copies.choices.choice[layer][:] = OWN
    copies.choices.choice[layer][0] = ALL
    before = {c.id: {n: t.clone() for n, t in c.module_tensors().items()} for c in server.clients}
    monkeypatch.setattr(copies, "check", lambda *args, **kwargs: None)
    server.selected_clients = server.select_clients()
    server.send_models()
    names = server._lag_tensors_of(layer)
    for client in server.clients:
        held = client.module_tensors()
        for name in names:
            expected = copies.everyone[name] if client.id == 0 else before[client.id][name]
            assert torch.equal(held[name], expected), (client.id, name)


def test_a_check_that_always_prefers_the_own_copy_is_fedlag_share_own_exactly(data_dir, tmp_path, monkeypatch):
    own = server_for(data_dir, tmp_path / "own", "-algo", "FedLAG", "--val_ratio", "0.25", "-gr", "3")
    monkeypatch.setattr("flcore.lag.checked_copies.copy_losses",
                        lambda model, batches, copies: [0.0] + [None if c is None else 1.0 for c in copies[1:]])
    checked = server_for(data_dir, tmp_path / "check", *CHECK, "-gr", "3")
    train(own)
    train(checked)
    a, _ = read_results(results_file(own))
    b, _ = read_results(results_file(checked))
    assert (a["rs_test_acc"] == b["rs_test_acc"]).all() and (a["rs_train_loss"] == b["rs_train_loss"]).all()
    assert (b["lag_copies"][b["lag_copies"] >= 0] == OWN).all()
    for x, y in zip(own.clients, checked.clients):
        assert state_equal(x.module_tensors(), y.module_tensors())


def test_the_choices_are_in_the_results_and_travel_in_the_checkpoint(data_dir, tmp_path):
    original, twin = original_and_restored_twin(data_dir, tmp_path, *CHECK, "-jr", "0.5", rounds_before=3)
    for a, b in zip(original.clients, twin.clients):
        assert state_equal(a.module_tensors(), b.module_tensors())
    a, b = original.lag_results(), twin.lag_results()
    assert torch.equal(a["lag_copies"], b["lag_copies"]) and torch.equal(a["lag_groups"], b["lag_groups"])
    copies = a["lag_copies"]
    assert copies.shape == (4, len(original.lag_layers), 6)  # three rounds, then one more each
    assert ((copies >= 0) == a["lag_personal"][:, :, None]).all()  # -1 exactly where the layer was shared
    layer = original.lag_personal[0]
    assert torch.equal(original.lag_check.choices.gap_sums[layer], twin.lag_check.choices.gap_sums[layer])
    assert torch.equal(original.lag_check.choices.gap_squares[layer], twin.lag_check.choices.gap_squares[layer])


def test_group_settings_with_one_client_are_refused_in_one_line(data_dir, tmp_path):
    for share in ("groups", "check"):
        with pytest.raises(LagError, match="-nc >= 2"):
            server_for(data_dir, tmp_path, "-algo", "FedLAG", "--lag_share", share, "--val_ratio", "0.25", "-nc", "1")
