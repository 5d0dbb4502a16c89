"""--lag_share groups: a personal layer averaged within the clients whose update profiles agree, and the
random-K control (--lag_schedule random)."""
import copy

import torch

from flcore.aggregation import named_tensors
from flcore.lag import LagSettings
from flcore.lag.conflict import Layer
from flcore.lag.groups import (MIN_UPLOADS, UpdateProfiles, add_updates, agreeing_groups, group_members,
                               leave_conflicting, profile_cosines, sample_weighted_average)
from flcore.lag.selector import LayerSelector, random_layers
from utils.result_utils import read_results
from helpers import original_and_restored_twin, play_round, results_file, server_for, state_equal, train

GROUPS = ("-algo", "FedLAG", "--lag_share", "groups")


# ----- the pure functions ---------------------------------------------------------------------------------
def test_profiles_sum_the_updates_and_count_them():
    profiles, counts = torch.zeros(3, 2, dtype=torch.float64), torch.zeros(3, dtype=torch.int64)
    add_updates(profiles, counts, torch.tensor([[3.0, 4.0], [0.0, 0.0]]), [2, 0])
    add_updates(profiles, counts, torch.tensor([[0.5, -2.0]]), [2])
    assert torch.equal(profiles[2], torch.tensor([3.5, 2.0], dtype=torch.float64))
    assert torch.equal(profiles[0], torch.zeros(2, dtype=torch.float64))  # a zero update carries nothing
    assert counts.tolist() == [0, 0, 2]


def test_profile_cosines_are_taken_less_the_mean_profile_of_the_counted_clients():
    # Every client pushes along x (the common direction); along y two of them go up, one down.
    profiles = torch.tensor([[5.0, 1.0], [5.0, 1.0], [5.0, -2.0], [9.0, 9.0]], dtype=torch.float64)
    counted = torch.tensor([True, True, True, False])
    cos, seen = profile_cosines(profiles, counted)
    # Less the mean (5, 0): (0, 1), (0, 1), (0, -2); client 3 is not counted.
    assert cos[0, 1] == 1.0 and cos[0, 2] == -1.0
    assert seen.tolist() == [[False, True, True, False], [True, False, True, False],
                             [True, True, False, False], [False, False, False, False]]


def test_average_linkage_merges_the_blocks_that_agree_and_keeps_apart_what_does_not():
    cos = torch.tensor([[1.0, 0.9, 0.2, -0.5, 0.0],
                        [0.9, 1.0, 0.3, -0.4, 0.0],
                        [0.2, 0.3, 1.0, -0.6, 0.0],
                        [-0.5, -0.4, -0.6, 1.0, 0.0],
                        [0.0, 0.0, 0.0, 0.0, 1.0]])
    seen = torch.ones(5, 5, dtype=torch.bool).fill_diagonal_(False)
    seen[4, :] = seen[:, 4] = False  # client 4 never uploaded: alone
    # 0 and 1 merge at 0.9; then {0, 1} and 2 have a mean of (0.2 + 0.3) / 2 = 0.25.
    assert agreeing_groups(cos, seen, 0.24).tolist() == [0, 0, 0, 3, 4]
    assert agreeing_groups(cos, seen, 0.26).tolist() == [0, 0, 2, 3, 4]
    assert agreeing_groups(cos, seen, -1.0).tolist() == [0, 0, 0, 0, 4]    # unseen pairs never merge
    assert group_members(torch.tensor([0, 0, 2, 0, 4])) == {0: [0, 1, 3]}


def test_ties_go_to_the_lower_client_ids():
    cos = torch.tensor([[1.0, 0.5, 0.5], [0.5, 1.0, 0.5], [0.5, 0.5, 1.0]])
    seen = torch.ones(3, 3, dtype=torch.bool).fill_diagonal_(False)
    cos[2, 0] = cos[0, 2] = cos[1, 2] = cos[2, 1] = -1.0
    assert agreeing_groups(cos, seen, 0.0).tolist() == [0, 0, 2]


def test_groups_follow_the_profiles_and_wait_for_enough_uploads():
    profiles = UpdateProfiles(4, above=0.5)
    up, down = torch.tensor([[1.0, 0.0]]), torch.tensor([[-1.0, 0.0]])
    for round_ in range(MIN_UPLOADS):
        updates = torch.cat([up, up, down, down])
        profiles.observe({1: updates}, [0, 1, 2, 3], personal=(1,))
        expected = [0, 0, 2, 2] if round_ == MIN_UPLOADS - 1 else [0, 1, 2, 3]
        assert profiles.groups_of(1).tolist() == expected
    assert profiles.groups_of(0).tolist() == [0, 1, 2, 3]     # a shared layer has no profiles
    profiles.observe({}, [], personal=(0,))                   # layer 1 returns to shared: its profiles go
    assert set(profiles.profiles) == set() and profiles.groups_of(1).tolist() == [0, 1, 2, 3]


def test_a_group_holds_until_a_member_conflicts_with_it():
    """Between the two thresholds nothing changes: a group formed above 0.5 holds while its cosines sit
    between 0 and 0.5, which would not form it afresh; a member below 0 (xi) on average leaves it."""
    cos = torch.tensor([[1.0, 0.3, 0.2], [0.3, 1.0, -0.4], [0.2, -0.4, 1.0]])
    seen = torch.ones(3, 3, dtype=torch.bool).fill_diagonal_(False)
    assert agreeing_groups(cos, seen, 0.5).tolist() == [0, 1, 2]                          # afresh: alone
    assert agreeing_groups(cos, seen, 0.5, torch.tensor([0, 0, 2])).tolist() == [0, 0, 2]  # {0, 1} holds
    # In {0, 1, 2}: means 0.25, -0.05, -0.1: client 2 leaves, then {0, 1} (0.3 >= 0) holds.
    assert leave_conflicting(torch.tensor([0, 0, 0]), cos, seen, 0.0).tolist() == [0, 0, 2]
    # Ties of the lowest mean: the higher id leaves.
    tie = torch.tensor([[1.0, 0.6, 0.6], [0.6, 1.0, -0.2], [0.6, -0.2, 1.0]])   # means 0.6, 0.2, 0.2
    assert leave_conflicting(torch.tensor([0, 0, 0]), tie, seen, 0.5).tolist() == [0, 0, 2]


def test_sample_weighted_average_by_hand():
    states = [{"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}, {"w": torch.tensor([4.0, 8.0]), "n": torch.tensor(5)}]
    out = sample_weighted_average(states, [1, 3])
    assert torch.equal(out["w"], torch.tensor([0.25 * 1 + 0.75 * 4, 0.25 * 2 + 0.75 * 8]))
    assert int(out["n"]) == 5   # a counter keeps the largest


# ----- on a real server -----------------------------------------------------------------------------------
def _force_groups(server, monkeypatch, labels):
    monkeypatch.setattr(server.lag_profiles, "groups_of", lambda layer: torch.tensor(labels))


def test_a_group_holds_the_sample_weighted_average_of_its_members_copies(data_dir, tmp_path, monkeypatch):
    server = server_for(data_dir, tmp_path, *GROUPS, "-jr", "0.5")
    play_round(server)  # the head becomes personal
    assert server.lag_personal_names() and server.lag_profiles is not None
    _force_groups(server, monkeypatch, [0, 0, 2, 0, 4, 4])
    server.selected_clients = server.select_clients()
    server.send_models()
    server.train_clients(server.selected_clients)
    server.receive_models()
    personal = server.lag_personal_names()
    copies = {c.id: {n: t.clone() for n, t in named_tensors(c.model).items()} for c in server.clients}
    samples = {c.id: c.train_samples for c in server.clients}
    server.aggregate_parameters()
    for members in ([0, 1, 3], [4, 5]):
        total = sum(samples[i] for i in members)
        for name in personal:
            expected = torch.zeros_like(copies[members[0]][name])
            for i in members:
                expected.add_(copies[i][name], alpha=samples[i] / total)
            for i in members:
                assert torch.equal(named_tensors(server.clients[i].model)[name], expected), (name, i)
    alone = named_tensors(server.clients[2].model)
    assert state_equal(alone, copies[2], personal)  # a client alone keeps its own copy
    assert server.lag_results()["lag_groups"][-1, server.lag_personal[0]].tolist() == [0, 0, 2, 0, 4, 4]


def test_the_group_average_does_not_depend_on_upload_order(data_dir, tmp_path, monkeypatch):
    results = []
    for reverse in (False, True):
        server = server_for(data_dir, tmp_path, *GROUPS)
        play_round(server)
        _force_groups(server, monkeypatch, [0, 0, 0, 3, 3, 3])
        server.selected_clients = server.select_clients()
        server.send_models()
        server.train_clients(server.selected_clients)
        server.receive_models()
        if reverse:
            server.uploads = server.uploads[::-1]
        server.aggregate_parameters()
        results.append([named_tensors(c.model) for c in server.clients])
    assert all(state_equal(a, b) for a, b in zip(*results))


def test_groups_are_checkpointed_and_resumed_exactly(data_dir, tmp_path):
    original, twin = original_and_restored_twin(data_dir, tmp_path, *GROUPS, "-jr", "0.5", rounds_before=MIN_UPLOADS)
    for a, b in zip(original.clients, twin.clients):
        assert state_equal(named_tensors(a.model), named_tensors(b.model))
    assert torch.equal(original.lag_results()["lag_groups"], twin.lag_results()["lag_groups"])
    layer = original.lag_personal[0]
    assert torch.equal(original.lag_profiles.profiles[layer], twin.lag_profiles.profiles[layer])


def test_the_groups_of_each_round_are_in_the_results_and_the_report_draws_them(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, *GROUPS, "-gr", "2")
    train(server)
    arrays, _ = read_results(results_file(server))
    groups = arrays["lag_groups"]
    assert groups.shape == (3, len(server.lag_layers), 6)
    personal = arrays["lag_personal"]
    assert ((groups >= 0) == personal[:, :, None]).all()  # -1 exactly where the layer was shared
    import report
    assert report.main([str(results_file(server)), "-o", str(tmp_path / "report")]) == 0
    drawn = sorted(p.name for p in (tmp_path / "report").glob("groups_*.png"))
    names = [server.lag_layers[i].name for i in sorted({int(l) for l in personal.nonzero()[1]})]
    assert len(drawn) == len(names) and all(n in name for n, name in zip(names, drawn))
    assert "Groups sharing a personal layer" in (tmp_path / "report" / "report.md").read_text()


def test_share_own_is_the_default_and_keeps_no_profiles(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedLAG")
    play_round(server)
    assert LagSettings().share == "own" and server.lag_profiles is None
    assert "lag_groups" not in server.lag_results()


# ----- the random control ------------------------------------------------------------------------------------
def test_random_layers_are_drawn_once_from_the_seed():
    assert random_layers(8, 3, seed=0) == random_layers(8, 3, seed=0)
    assert len(set(random_layers(8, 3, seed=0))) == 3 and random_layers(8, 0, seed=0) == ()
    assert len({random_layers(8, 3, seed=s) for s in range(10)}) > 1


def test_random_schedule_keeps_its_draw_whatever_the_evidence():
    layers = [Layer(f"l{i}", (f"l{i}.weight",)) for i in range(5)]
    settings = LagSettings(schedule="random", top_k=2)
    selector = LayerSelector(settings, layers, seed=3)
    drawn = selector.personal
    assert drawn == random_layers(5, 2, 3)
    from flcore.lag.conflict import layer_evidence
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        selector.observe(layer_evidence([torch.randn(4, 6, generator=g) for _ in layers], 0.0), uploads=4)
        assert selector.personal == drawn
    restored = LayerSelector.from_state_dict(settings, copy.deepcopy(selector.state_dict()))
    assert restored.personal == drawn


def test_random_schedule_on_a_server_uses_the_run_seed(data_dir, tmp_path):
    draws = {seed: server_for(data_dir, tmp_path, "-algo", "FedLAG", "--lag_schedule", "random",
                              "--seed", str(seed)).lag_personal for seed in (0, 1, 2, 3)}
    assert all(len(d) == 1 for d in draws.values())
    for seed, drawn in draws.items():
        layers = len(server_for(data_dir, tmp_path, "-algo", "FedLAG").lag_layers)
        assert drawn == random_layers(layers, 1, seed)
