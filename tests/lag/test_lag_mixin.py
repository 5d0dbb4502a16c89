"""LayerConflictMixin on real servers: what is kept, what is overwritten, schedules, signals, naming."""
import copy

import numpy as np
import pytest
import torch

from flcore.aggregation import named_tensors
from flcore.clients.clientavg import clientAVG
from flcore.lag import LagError, LagSettings, top_k_positive, with_layer_conflict
from flcore.lag.candidates import own_personal_layers
from flcore.lag.client_tensors import model_snapshot, model_tensors
from flcore.lag.conflict import layer_evidence, stack_layer_updates
from flcore.registry import UnknownAlgorithmError, resolve
from flcore.servers.serveravg import FedAvg
from utils.result_utils import read_results
from helpers import (assert_lag_composes, in_use, perturb_all_clients, play_round, results_file, server_for,
                      server_of_class, state_equal, train, train_and_compare)



def test_broadcast_keeps_personal_layers_and_overwrites_shared_ones_on_every_client(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedLAG", "-m", "CNN", "--lag_top_k", "2",
                        "--lag_granularity", "module")
    play_round(server)
    personal = set(server.lag_personal_names())
    assert len(server.lag_personal) == 2  # two modules (the default granularity): weight and bias each
    assert len(personal) == 4
    perturb_all_clients(server)
    before = {c.id: copy.deepcopy(c.module_tensors()) for c in server.clients}
    server.selected_clients = server.select_clients()
    server.send_models()
    global_state = named_tensors(server.global_model)
    shared = set(global_state) - personal
    for client in server.clients:
        state = client.module_tensors()
        assert state_equal(state, before[client.id], personal), f"client {client.id} lost a personal layer"
        assert state_equal(state, global_state, shared), f"client {client.id} missed a shared layer"
        assert not state_equal(state, global_state, personal)


def test_a_client_never_loads_a_personal_layer(data_dir, tmp_path, monkeypatch):
    """LAG filters what a client receives: the personal layers (and their modules' buffers) are left out
    of the broadcast itself, so no client ever copies them in (nothing is overwritten and put back)."""
    server = server_for(data_dir, tmp_path, "-algo", "FedLAG", "-m", "ResNet20", "-nc", "6", "-gr", "0",
                        "--lag_granularity", "module", "--lag_top_k", "1")
    play_round(server)
    bn_layer = next(i for i, layer in enumerate(server.lag_layers) if layer.name.endswith("bn1"))
    server.lag_selector.personal = (bn_layer,)
    module = server.lag_layers[bn_layer].name
    kept = {f"{module}.{s}" for s in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")}
    assert server.personal_names() == kept
    assert kept.isdisjoint(server.broadcast()) and set(server.broadcast()) | kept == set(server.shared_tensors())
    loaded = set()
    for client in server.clients:
        original = client.set_parameters
        monkeypatch.setattr(client, "set_parameters",
                            lambda broadcast, _set=original: (loaded.update(broadcast), _set(broadcast)))
    server.send_models()
    assert loaded and loaded.isdisjoint(kept)


def test_k_is_checked_before_round_0_from_what_clients_declare_without_an_upload(data_dir, tmp_path, monkeypatch):
    """Building an X+LAG server uploads nothing: the candidate layers come from the clients' declaration of
    what they share, so a K that leaves nothing shared is refused before any round."""
    from flcore.clients.clientbase import Client

    def no_upload(client):
        raise AssertionError(f"client {client.id} uploaded while the server was being built")
    monkeypatch.setattr(Client, "upload", no_upload)
    server = server_for(data_dir, tmp_path, "-algo", "FedRep+LAG", "-m", "CNN", "--lag_top_k", "2",
                        "--lag_granularity", "module")
    assert [layer.name for layer in server.lag_layers] == ["base.conv1.0", "base.conv2.0", "base.fc1.0"]
    assert server.lag_selector.own_personal == ("head",)
    with pytest.raises(LagError, match="would keep every one of the 3 layers FedRep shares personal"):
        server_for(data_dir, tmp_path, "-algo", "FedRep+LAG", "-m", "CNN", "--lag_top_k", "4",
                   "--lag_granularity", "module")


def test_the_mixin_knows_its_base_class_and_extends_hooks_every_server_has():
    """X+LAG records X's class (FedLAG: FedAvg's), not a name read from the flags; every base hook the mixin
    extends through super() exists on this project's Server (nothing asks whether it does), and on the
    PFLlib adapter where upstream's Server lacks it."""
    import ast
    import inspect

    import flcore.lag.mixin as mixin_module
    import flcore.lag.records as records_module
    from flcore.servers.serverbase import Server
    from flcore.servers.serverfedlag import FedLAG
    from flcore.servers.serverrep import FedRep
    assert resolve("FedRep+LAG")[0].lag_base is FedRep and FedLAG.lag_base is FedAvg
    source = inspect.getsource(mixin_module) + "\n" + inspect.getsource(records_module.LagRecords)
    assert "hasattr" not in source and "removesuffix" not in source
    extended = {node.attr for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "super"}
    assert {"personal_names", "personal_payload", "send_models", "finish", "extra_state", "get_state"} <= extended
    for name in extended - {"__init__", "__init_subclass__"}:
        assert callable(getattr(Server, name, None)), name
    import importlib.util
    from helpers import REPO
    spec = importlib.util.spec_from_file_location("lag_pfllib_probe", REPO / "patches" / "pfllib" / "lag_pfllib.py")
    adapter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(adapter)
    upstream_has = {"__init__", "__init_subclass__", "send_models", "receive_models", "aggregate_parameters"}
    for name in extended - upstream_has:
        assert callable(getattr(adapter.UpstreamCompat, name, None)), name


def test_top_k_zero_reproduces_fedavg_exactly(data_dir, tmp_path):
    common = ("-m", "CNN", "-jr", "0.5", "-gr", "3")
    fedavg = server_for(data_dir, tmp_path / "avg", "-algo", "FedAvg", *common)
    fedlag = server_for(data_dir, tmp_path / "lag", "-algo", "FedLAG", "--lag_top_k", "0", *common,
                        "--lag_granularity", "module")
    _, (b, attrs) = train_and_compare(fedavg, fedlag)
    # ...while the conflict analysis is still recorded, for the heatmap.
    assert b["lag_conflict_scores"].shape == (4, 4) and not b["lag_personal"].any()  # 4 rounds x 4 modules
    assert attrs["lag"]["top_k"] == 0


@pytest.mark.parametrize("base, own", [("FedRep", "head"), ("FedROD", "personal_head")])
def test_k_counts_the_layers_the_base_method_keeps_personal(data_dir, tmp_path, capsys, base, own):
    """X+LAG with K = X's own personal layers is X exactly (conflicts still recorded); K + 1 adds one."""
    common = ("-m", "CNN", "-jr", "0.5", "-gr", "2", "--lag_granularity", "module")
    plain = server_for(data_dir, tmp_path / "base", "-algo", base, *common)
    lag = server_for(data_dir, tmp_path / "lag", "-algo", f"{base}+LAG", "--lag_top_k", "1", *common)
    assert lag.lag_selector.own_personal == (own,) and lag.lag_selector.extra == 0
    assert f"{base} already keeps 1 layer(s) personal ({own})" in capsys.readouterr().out
    _, (b, _) = train_and_compare(plain, lag)
    assert b["lag_pairs"].any() and not b["lag_personal"].any()
    more = server_for(data_dir, tmp_path / "more", "-algo", f"{base}+LAG", "--lag_top_k", "2", *common)
    assert more.lag_selector.extra == 1


def test_own_layers_are_those_the_client_trains_even_when_frozen_between_phases(data_dir, tmp_path):
    """Upstream FedRep freezes its head after the head epochs: its optimiser still holds it, so it counts.
    A head nothing trains (FedBABU's, frozen at its initial value) is not a personal layer."""
    server = server_for(data_dir, tmp_path, "-algo", "FedRep+LAG", "-m", "CNN", "--lag_top_k", "1",
                        "--lag_granularity", "module")
    client = server.clients[0]
    client.check_out()
    candidates = server.lag_layers
    client.model.head.requires_grad_(False)
    assert own_personal_layers(client, candidates, "module") == ["head"]
    client.head_optimizer = None  # no optimiser holds the head any more
    assert own_personal_layers(client, candidates, "module") == []


def test_every_round_schedule_picks_the_top_k_of_each_round(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedLAG", "-m", "CNN", "-gr", "3", "--lag_top_k", "3",
                        "--lag_schedule", "every_round", "--lag_granularity", "tensor")
    train(server)
    arrays, _ = read_results(results_file(server))
    for scores, personal in zip(arrays["lag_conflict_scores"], arrays["lag_personal"]):
        assert scores.any()
        assert tuple(np.flatnonzero(personal).tolist()) == top_k_positive(torch.as_tensor(scores), 3)


def test_warmup_schedule_freezes_the_top_k_of_the_summed_warmup_scores(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedLAG", "-m", "CNN", "-gr", "4", "--lag_top_k", "2",
                        "--lag_schedule", "warmup", "--lag_warmup", "2", "--lag_granularity", "tensor")
    train(server)
    arrays, _ = read_results(results_file(server))
    personal, scores = arrays["lag_personal"], arrays["lag_conflict_scores"]
    assert not personal[0].any()
    frozen = top_k_positive(torch.as_tensor(scores[:2].sum(axis=0)), 2)
    assert len(frozen) == 2
    for row in personal[1:]:
        assert tuple(np.flatnonzero(row).tolist()) == frozen


def test_delta_signal_is_the_change_since_the_broadcast(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedLAG", "-m", "DNN")
    server.selected_clients = server.select_clients()
    server.send_models()
    start = copy.deepcopy(dict(server.global_model.named_parameters()))
    server.train_clients(server.selected_clients)
    server.receive_models()
    client = server.clients[0]
    update = server.lag_update_of(client.id)
    for name, param in in_use(client).model.named_parameters():
        assert torch.equal(update[name], (param.detach() - start[name]).reshape(-1))


def test_dropped_uploads_are_not_scored_and_the_rest_score_as_if_alone(data_dir, tmp_path):
    """With -cdr some selected clients never upload: their rows are zero and unscored, and the round's
    evidence is that of the uploads' updates alone (a Gram matrix over them, by hand)."""
    server = server_for(data_dir, tmp_path, "-algo", "FedLAG", "-m", "DNN", "-cdr", "0.5")
    server.selected_clients = server.select_clients()
    server.send_models()
    start = {c.id: {n: t.clone() for n, t in c.module_tensors().items()} for c in server.selected_clients}
    server.train_clients(server.selected_clients)
    server.receive_models()
    uploaded = [u.client_id for u in server.uploads]
    assert 2 <= len(uploaded) < len(server.selected_clients)
    assert set(server.lag_updates.scored) == set(uploaded)
    for row, client in enumerate(server.selected_clients):  # rows in selection order
        if client.id not in uploaded:
            assert not server.lag_updates.matrix[row].any()
    by_id = {c.id: c for c in server.clients}
    updates = [{n: (p.detach() - start[i][n]) for n, p in in_use(by_id[i]).model.named_parameters()}
               for i in uploaded]
    expected = layer_evidence(stack_layer_updates(updates, server.lag_layers), server.lag.xi)
    assert torch.equal(server.lag_selector.history["scores"][-1], expected.conflicts)
    assert torch.equal(server.lag_selector.history["pairs"][-1], expected.pairs)


def test_a_start_held_by_reference_is_never_written_and_a_live_model_is_copied(data_dir, tmp_path):
    """A parked client's starting tensors are held by reference (training replaces them, never writes
    them); a client whose model is live (a PFLlib client) is copied, so training it in place leaves the
    start as it was."""
    server = server_for(data_dir, tmp_path, "-algo", "FedLAG", "-m", "DNN", "-jr", "1")
    play_round(server)  # a client parks once it has trained
    parked, live = server.clients[0], server.clients[1]
    live.check_out()
    assert parked.is_parked("model") and not live.is_parked("model")
    held, copied = model_snapshot(parked), model_snapshot(live)
    assert all(held[n] is t for n, t in model_tensors(parked).items())
    held_before, copied_before = ({n: t.clone() for n, t in state.items()} for state in (held, copied))
    with torch.no_grad():
        for param in live.model.parameters():
            param.add_(1.0)
    server.train_clients([parked])
    assert state_equal(held, held_before) and state_equal(copied, copied_before)
    assert not state_equal(model_tensors(parked), held)


def test_last_batch_signal_is_the_gradient_left_by_local_training(data_dir, tmp_path, monkeypatch):
    """The gradient each client's last minibatch left on its model when it uploaded (a client parks its
    model afterwards, and a parked model keeps no .grad)."""
    server = server_for(data_dir, tmp_path, "-algo", "FedLAG", "-m", "DNN", "--lag_signal", "last_batch")
    left = {}
    upload = clientAVG.upload

    def recording_upload(client):
        left[client.id] = {n: p.grad.clone() for n, p in client.model.named_parameters() if p.grad is not None}
        return upload(client)

    monkeypatch.setattr(clientAVG, "upload", recording_upload)
    play_round(server)
    assert left
    for client_id, gradients in left.items():
        update = server.lag_update_of(client_id)
        assert set(gradients) == set(update)
        for name, gradient in gradients.items():
            assert torch.equal(update[name], gradient.reshape(-1))


class BaseOnlyClient(clientAVG):
    shared_path = "base"  # uploads and receives only the feature extractor, as FedPer does


class BaseOnly(FedAvg):
    client_class = BaseOnlyClient


def test_generic_composition_check_on_a_base_only_server(data_dir, tmp_path):
    # K counts the head BaseOnly keeps itself (2 tensors): K = 4 adds two shared tensors.
    server = server_of_class(with_layer_conflict(BaseOnly), data_dir, tmp_path, "-m", "CNN", "--lag_top_k", "4")
    personal = assert_lag_composes(server, k=2)
    assert all(n.startswith("base.") for n in personal)


def test_partial_uploads_map_to_full_names_and_base_personal_parts_stay_local(data_dir, tmp_path):
    server = server_of_class(with_layer_conflict(BaseOnly), data_dir, tmp_path, "-m", "CNN", "--lag_top_k", "4")
    for _ in range(6):  # until two layers have had a conflicting pair
        play_round(server)
        if len(server.lag_personal) == 2:
            break
    candidates = [n for layer in server.lag_layers for n in layer.tensors]
    assert candidates and all(n.startswith("base.") for n in candidates)  # heads are X's own, never ranked
    personal = set(server.lag_personal_names())
    assert len(server.lag_personal) == 2 and personal <= set(candidates)
    perturb_all_clients(server)
    before = {c.id: copy.deepcopy(c.module_tensors()) for c in server.clients}
    server.send_models()
    global_state = named_tensors(server.global_model)
    for client in server.clients:
        state = client.module_tensors()
        own = personal | {n for n in state if n.startswith("head.")}
        assert state_equal(state, before[client.id], own)
        assert state_equal(state, global_state, set(state) - own)


def test_batchnorm_buffers_are_never_layers_and_follow_their_module(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedLAG", "-m", "ResNet20", "-nc", "6", "-gr", "0",
                        "--lag_granularity", "module", "--lag_top_k", "1")
    play_round(server)
    buffers = {n for n, _ in in_use(server.clients[0]).model.named_buffers()}
    layer_tensors = {n for layer in server.lag_layers for n in layer.tensors}
    assert layer_tensors and not layer_tensors & buffers
    bn_layer = next(i for i, l in enumerate(server.lag_layers) if l.name.endswith("bn1"))
    assert server.lag_layers[bn_layer].tensors == (f"{server.lag_layers[bn_layer].name}.weight",
                                                   f"{server.lag_layers[bn_layer].name}.bias")
    server.lag_selector.personal = (bn_layer,)
    module = server.lag_layers[bn_layer].name
    kept = {f"{module}.{s}" for s in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")}
    perturb_all_clients(server)
    before = {c.id: copy.deepcopy(c.module_tensors()) for c in server.clients}
    server.send_models()
    for client in server.clients:
        state = client.module_tensors()
        assert state_equal(state, before[client.id], kept)
        assert state_equal(state, named_tensors(server.global_model), set(state) - kept)


def test_lag_is_refused_where_nothing_is_shared_and_bad_settings_are_named():
    with pytest.raises(UnknownAlgorithmError, match="Local trains every client alone"):
        resolve("Local+LAG")
    with pytest.raises(UnknownAlgorithmError, match="already"):
        resolve("FedLAG+LAG")
    with pytest.raises(LagError, match="--lag_xi must be in"):
        LagSettings(xi=0.3).check()
    assert resolve("FedAvg+LAG")[0].__mro__[1].__name__ == "LayerConflictMixin"


# ----- defects that must stay fixed --------------------------------------------------------------------------
def test_last_batch_signal_survives_rounds_without_uploads_and_every_round_has_a_row(data_dir, tmp_path):
    # One client selected per round and half of the trained clients dropped: most rounds upload nothing.
    server = server_for(data_dir, tmp_path, "-algo", "FedLAG", "-m", "DNN", "-gr", "6", "--lag_signal", "last_batch",
                        "-jr", "0.17", "-cdr", "0.5", "-rjr")
    train(server)
    arrays, attrs = read_results(results_file(server))
    uploads = arrays["lag_num_uploads"]
    assert attrs["complete"]
    assert len(uploads) == 7 and arrays["lag_conflict_scores"].shape[0] == 7 and len(arrays["lag_scored"]) == 7
    assert (uploads == 0).any()                                   # the case that used to crash
    assert not arrays["lag_scored"][uploads < 2].any()            # rounds without a pair are marked unscored
    assert not arrays["lag_conflict_scores"][uploads < 2].any()


def test_rows_line_up_with_rounds_when_the_first_rounds_upload_nothing(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedLAG", "-m", "DNN", "-gr", "3")
    server.lag_selector = None  # as a server whose candidate layers are only known from an upload
    server.receive_models = lambda base=server.receive_models: _receive_nothing_before_round(server, base, 2)
    train(server)
    arrays, _ = read_results(results_file(server))
    assert arrays["lag_num_uploads"].tolist()[:2] == [0, 0]
    assert arrays["lag_scored"].tolist()[:2] == [False, False]
    assert arrays["lag_conflict_scores"].shape[0] == arrays["lag_personal"].shape[0] == 4


def _receive_nothing_before_round(server, receive, first_round):
    if server.current_round < first_round:
        server.selected_clients = []
    receive()


@pytest.mark.parametrize("algorithm, flags, layers", [
    # LG-FedAvg shares only the head (one module) and keeps 3 personal, which K counts
    ("LG-FedAvg+LAG", ("--lag_granularity", "module", "--lag_top_k", "4"), 1),
    ("FedLAG", ("--lag_top_k", "100", "--lag_granularity", "module"), 4),
    ("FedLAG", ("--lag_top_k", "8", "--lag_granularity", "tensor"), 8),
])
def test_a_k_that_would_personalise_every_shared_layer_is_refused(data_dir, tmp_path, algorithm, flags, layers):
    with pytest.raises(LagError, match=rf"would keep every one of the {layers} layers .* \(Local\)"):
        server_for(data_dir, tmp_path, "-algo", algorithm, "-m", "CNN", *flags)


def test_warmup_longer_than_the_run_and_zero_warmup_are_refused_at_parse_time(data_dir, tmp_path, capsys):
    for flags, message in ((("-gr", "4", "--lag_warmup", "9"), "--lag_warmup 9 is longer than the run"),
                           (("-gr", "4", "--lag_warmup", "0"), "--lag_warmup must be >= 1")):
        with pytest.raises(SystemExit):
            server_for(data_dir, tmp_path, "-algo", "FedLAG", "--lag_schedule", "warmup", *flags)
        assert message in capsys.readouterr().err
    with pytest.raises(LagError, match="--lag_warmup 9 is longer"):
        LagSettings(schedule="warmup", warmup=9).check(global_rounds=4)


def test_a_lag_run_ends_with_the_command_for_its_base_method():
    from main import comparison_hint
    assert comparison_hint("FedLAG", ["-algo", "FedLAG", "-gr", "50", "-go", "my run"]) == \
        "compare with the base method: python system/main.py -algo FedAvg -gr 50 -go 'my run'\n" \
        "and with each client alone: python system/main.py -algo Local -gr 50 -go 'my run'"
    assert comparison_hint("FedRep+LAG", ["--algorithm=FedRep+LAG", "-jr", "0.2"]).endswith("-algo FedRep -jr 0.2")
    assert comparison_hint("FedAvg", ["-algo", "FedAvg"]) == ""
