"""--lag_share groups: a personal layer averaged within the clients whose update profiles agree, and the
random-K control (--lag_schedule random)."""
import copy

import pytest
import torch

from flcore.lag import LagSettings
from flcore.lag.choice import random_layers
from flcore.lag.conflict import Layer
from flcore.lag.groups import (MIN_UPLOADS, UpdateProfiles, add_updates, agreeing_groups, group_members,
                               leave_conflicting, profile_cosines, sample_weighted_average)
from flcore.lag.selector import LayerSelector
from flcore.lag.sharing import GroupSharing
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


def test_sharing_forms_each_groups_model_by_hand_and_gives_members_one_object():
    """Three clients, groups {0, 1} and {2} of a module's weight and bias: the members' payload part is
    the sample-weighted average of their copies (1 and 3 samples: weights 1/4 and 3/4), named relative to
    the shared module, one object for both; client 2, alone, receives nothing beyond the broadcast."""
    sharing = GroupSharing(3, above=0.1, below=0.0, prefix="base")
    sharing.history.append(torch.tensor([[-1, -1, -1], [0, 0, 2]]))  # layer 1 personal, clients 0 and 1 together
    held = {0: {"base.fc.weight": torch.tensor([1.0, 2.0]), "base.fc.bias": torch.tensor([4.0])},
            1: {"base.fc.weight": torch.tensor([5.0, -2.0]), "base.fc.bias": torch.tensor([0.0])},
            2: {"base.fc.weight": torch.tensor([9.0, 9.0]), "base.fc.bias": torch.tensor([9.0])}}
    sharing.share([1], lambda layer: ("base.fc.weight", "base.fc.bias"), held.__getitem__, [1, 3, 5])
    part = sharing.payload(0)
    assert part is sharing.payload(1) and sharing.payload(2) is None
    assert set(part) == {"fc.weight", "fc.bias"}
    assert torch.equal(part["fc.weight"], torch.tensor([0.25 * 1 + 0.75 * 5, 0.25 * 2 + 0.75 * -2]))
    assert torch.equal(part["fc.bias"], torch.tensor([1.0]))
    assert torch.equal(held[0]["base.fc.weight"], torch.tensor([1.0, 2.0]))  # the copies are read, never written
    sharing.clear()  # a round without uploads: nothing to deliver
    assert sharing.payload(0) is None


def test_a_later_layer_averages_what_an_earlier_one_gave_its_members():
    """At tensor granularity a module's weight and bias are two layers that both carry its buffers: the
    second averages the members' buffers as the first left them, as when the averages were written at once."""
    sharing = GroupSharing(3, above=0.1, below=0.0)
    sharing.history.append(torch.tensor([[0, 0, 2], [0, 1, 1]]))
    held = {i: {"bn.weight": torch.tensor([float(i)]), "bn.bias": torch.tensor([float(i)]),
                "bn.mean": torch.tensor([float(10 * i)])} for i in range(3)}
    names = {0: ("bn.weight", "bn.mean"), 1: ("bn.bias", "bn.mean")}
    sharing.share([0, 1], names.__getitem__, held.__getitem__, [1, 1, 1])
    assert torch.equal(sharing.payload(0)["bn.mean"], torch.tensor([5.0]))           # layer 0's group {0, 1}
    assert torch.equal(sharing.payload(1)["bn.mean"], torch.tensor([12.5]))          # (5 + 20) / 2: 1 had 5
    assert torch.equal(sharing.payload(2)["bn.mean"], torch.tensor([12.5]))
    assert torch.equal(sharing.payload(1)["bn.weight"], torch.tensor([0.5]))
    assert "bn.weight" not in sharing.payload(2) and torch.equal(sharing.payload(2)["bn.bias"], torch.tensor([1.5]))


def test_a_group_holds_the_sample_weighted_average_of_its_members_copies(data_dir, tmp_path, monkeypatch):
    """Aggregation writes into no client: it forms the groups' models, which the members' payloads carry
    (one object per group; a client alone gets the plain broadcast, the very object every client without
    a group gets), and the next send_models delivers them."""
    server = server_for(data_dir, tmp_path, *GROUPS, "-jr", "0.5")
    play_round(server)  # the head becomes personal
    assert server.lag_personal_names() and server.lag_profiles is not None
    _force_groups(server, monkeypatch, [0, 0, 2, 0, 4, 4])
    server.selected_clients = server.select_clients()
    server.send_models()
    server.train_clients(server.selected_clients)
    server.receive_models()
    personal = server.lag_personal_names()
    copies = {c.id: {n: t.clone() for n, t in c.module_tensors().items()} for c in server.clients}
    samples = {c.id: c.train_samples for c in server.clients}
    server.aggregate_parameters()
    for client in server.clients:
        assert state_equal(client.module_tensors(), copies[client.id]), f"client {client.id} was written"
    with server.sending():
        payloads = {c.id: server.payload(c.id) for c in server.clients}
        assert payloads[2] is server.payload(2) and payloads[2] is not payloads[0]
        assert set(payloads[2]) == set(server.broadcast()) and personal[0] not in payloads[2]
    assert payloads[0] is payloads[1] is payloads[3] and payloads[4] is payloads[5]
    for members in ([0, 1, 3], [4, 5]):
        total = sum(samples[i] for i in members)
        for name in personal:
            expected = torch.zeros_like(copies[members[0]][name])
            for i in members:
                expected.add_(copies[i][name], alpha=samples[i] / total)
            assert torch.equal(payloads[members[0]][name], expected), name
    server.send_models()
    for members in ([0, 1, 3], [4, 5]):
        for i in members:
            assert state_equal(server.clients[i].module_tensors(), payloads[members[0]], personal), i
    assert state_equal(server.clients[2].module_tensors(), copies[2], personal)  # alone: its own copy
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
        server.send_models()  # the personal layers: each group's model (the shared ones: FedAvg's sum, in upload order)
        personal = server.personal_names()
        results.append([{n: t for n, t in c.module_tensors().items() if n in personal} for c in server.clients])
    assert all(a and state_equal(a, b) for a, b in zip(*results))


@pytest.mark.parametrize("algorithm, k", [("FedAS+LAG", "3"), ("FedALA+LAG", "1")])
def test_a_method_that_delivers_its_own_way_gives_members_their_groups_model_first(data_dir, tmp_path,
                                                                                 monkeypatch, algorithm, k):
    """FedAS aligns, and FedALA mixes, the body on the model the client holds, personal layers included, in
    a send_models of their own that delivers no payloads: the group models reach the members before it
    (each member's first delivery of the round), as they did when they were written at aggregation."""
    server = server_for(data_dir, tmp_path, "-algo", algorithm, "--lag_top_k", k, "--lag_share", "groups", "-jr", "1")
    play_round(server)
    _force_groups(server, monkeypatch, [0, 0, 0, 3, 3, 3])
    play_round(server)
    part = server.personal_payload(0)
    assert part is not None and part is server.personal_payload(1)
    first = {}
    for client in server.clients:
        def recording(values, slot="model", frozen=None, _client=client, _original=client.receive_tensors):
            first.setdefault(_client.id, set(values))
            return _original(values, slot=slot, frozen=frozen)
        monkeypatch.setattr(client, "receive_tensors", recording)
    server.selected_clients = server.select_clients()
    server.send_models()
    path = server.client_class.shared_path
    full = {f"{path}.{n}" if path else n for n in part}
    for client in server.clients:
        assert first[client.id] == full, client.id
        held = client.module_tensors()
        group = server.personal_payload(client.id)
        assert all(torch.equal(held[f"{path}.{n}" if path else n], t) for n, t in group.items()), client.id


def test_only_send_models_and_finish_write_into_clients(data_dir, tmp_path):
    """Every client's receive path is instrumented through a whole run whose groups form: tensors arrive
    only in send_models (and finish), and a member's personal layer is the very tensor of its payload."""
    server = server_for(data_dir, tmp_path, *GROUPS, "-gr", str(MIN_UPLOADS + 2))
    hook = {"now": None}
    for name in ("send_models", "evaluate", "train_clients", "receive_models", "aggregate_parameters",
                 "end_round", "finish"):
        original = getattr(server, name)

        def marked(*args, _original=original, _name=name, **kwargs):
            outer, hook["now"] = hook["now"], hook["now"] or _name
            try:
                return _original(*args, **kwargs)
            finally:
                hook["now"] = outer
        setattr(server, name, marked)
    received = []
    for client in server.clients:
        def recording(values, slot="model", frozen=None, _client=client, _original=client.receive_tensors):
            received.append((hook["now"], _client.id, dict(values)))
            return _original(values, slot=slot, frozen=frozen)
        client.receive_tensors = recording
    train(server)
    assert {phase for phase, _, _ in received} <= {"send_models", "finish"}
    personal = set(server.lag_personal_names())
    grouped = [(i, values) for phase, i, values in received if personal & set(values)]
    assert grouped, "no group model was delivered: the run is too short for groups to form"
    groups = server.lag_results()["lag_groups"]
    assert (groups[-1] >= 0).any()


def test_groups_are_checkpointed_and_resumed_exactly(data_dir, tmp_path):
    original, twin = original_and_restored_twin(data_dir, tmp_path, *GROUPS, "-jr", "0.5", rounds_before=MIN_UPLOADS)
    for a, b in zip(original.clients, twin.clients):
        assert state_equal(a.module_tensors(), b.module_tensors())
    assert torch.equal(original.lag_results()["lag_groups"], twin.lag_results()["lag_groups"])
    layer = original.lag_personal[0]
    assert torch.equal(original.lag_profiles.profiles[layer], twin.lag_profiles.profiles[layer])


def test_group_models_waiting_for_the_broadcast_travel_in_the_checkpoint(data_dir, tmp_path, monkeypatch):
    """Saved between aggregation and the next broadcast, a state holds the group models not yet delivered;
    a server loading it delivers them as the original does (the same tensors, bit for bit)."""
    original = server_for(data_dir, tmp_path, *GROUPS, "-jr", "0.5")
    play_round(original)
    _force_groups(original, monkeypatch, [0, 0, 2, 0, 4, 4])
    play_round(original)
    assert original.personal_payload(0) is not None and original.personal_payload(2) is None
    torch.save(original.get_state(), tmp_path / "state.pt")
    twin = server_for(data_dir, tmp_path, *GROUPS, "-jr", "0.5", "--seed", "7")
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    twin.check_state(state)
    twin.set_state(state)
    for i in range(6):
        a, b = original.personal_payload(i), twin.personal_payload(i)
        assert (a is None) == (b is None) and (a is None or state_equal(a, b)), i
    assert twin.personal_payload(0) is twin.personal_payload(1)  # still one object for the group
    original.send_models()
    twin.send_models()
    for a, b in zip(original.clients, twin.clients):
        assert state_equal(a.module_tensors(), b.module_tensors())


def test_a_state_saved_when_group_models_were_written_at_once_delivers_nothing_more():
    """A checkpoint from before the group models waited for the broadcast has none pending: its members
    hold them already, so the next broadcast must not bring any."""
    sharing = GroupSharing(3, above=0.1, below=0.0)
    sharing.history.append(torch.tensor([[0, 0, 2]]))
    sharing.share([0], lambda layer: ("w",), lambda i: {"w": torch.tensor([float(i)])}, [1, 1, 1])
    older = {key: value for key, value in sharing.state_dict().items() if key not in ("parts", "receives")}
    restored = GroupSharing(3, above=0.1, below=0.0)
    restored.load_state_dict(older)
    assert restored.payload(0) is None and torch.equal(restored.history[0], sharing.history[0])
    restored.load_state_dict(sharing.state_dict())
    assert torch.equal(restored.payload(0)["w"], torch.tensor([0.5])) and restored.payload(0) is restored.payload(1)


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
