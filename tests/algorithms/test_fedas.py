"""FedAS: Fisher-weighted body averaging (with a guarded fallback), parameter alignment, FedAS+LAG."""
import copy

import numpy as np
import pytest
import torch
from torch import nn

from flcore.aggregation import named_tensors
from flcore.clients.clientas import ALIGNMENT_LR, fisher_trace, prototype_alignment_loss
from flcore.servers.serveras import fisher_weights
from flcore.training.classfeatures import class_feature_stats
from utils.result_utils import read_results
from helpers import assert_lag_composes, in_use, play_round, server_for, state_equal, perturb_all_clients, upload_current_state, train, results_file


def trained_round(data_dir, tmp_path, *extra):
    """A FedAS server whose selected clients have trained and uploaded (nothing aggregated yet)."""
    server = server_for(data_dir, tmp_path, "-algo", "FedAS", "-lbs", "32", *extra)
    server.selected_clients = server.select_clients()
    server.send_models()
    server.train_clients(server.selected_clients)
    server.receive_models()
    return server


def test_fisher_trace_of_a_zero_linear_model_has_a_closed_form():
    model = nn.Linear(3, 2)
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(4, 3, generator=g), torch.tensor([0, 1, 1, 0])),
               (torch.randn(2, 3, generator=g), torch.tensor([1, 1]))]
    expected = 0.0
    for x, y in batches:
        residual = torch.full((len(y), 2), 0.5) - nn.functional.one_hot(y, 2)  # softmax(0) - onehot
        expected += float((residual.T @ x / len(y)).pow(2).sum() + residual.mean(0).pow(2).sum())
    assert float(fisher_trace(model, batches)) == pytest.approx(expected, rel=1e-6)
    assert model.training  # the mode is restored


def test_fisher_weights_are_normalised_traces_and_undefined_ones_are_refused():
    assert fisher_weights([1.0, 2.0, 5.0]) == pytest.approx([0.125, 0.25, 0.625])
    for bad in ([1.0, float("nan")], [0.0, 0.0], [1.0, float("inf")], []):
        assert fisher_weights(bad) is None


def test_bodies_are_averaged_with_fisher_weights(data_dir, tmp_path):
    server = trained_round(data_dir, tmp_path, "-jr", "0.5")
    uploaders = [c for c in server.clients if c.id in server.uploader_ids()]
    assert all(np.isfinite(c.fisher_trace) and c.fisher_trace > 0 for c in uploaders)
    for client, trace in zip(uploaders, (1.0, 2.0, 5.0)):
        client.fisher_trace = trace
    upload_current_state(server, uploaders)
    server.receive_models()
    assert server.upload_weights == pytest.approx([0.125, 0.25, 0.625])
    assert server.history["rs_fisher_trace"][-1][server.uploader_ids()].tolist() == [1.0, 2.0, 5.0]
    server.aggregate_parameters()
    for name, value in named_tensors(server.global_model.base).items():
        expected = sum(w * named_tensors(in_use(c).model.base)[name] for w, c in zip((0.125, 0.25, 0.625), uploaders))
        assert torch.allclose(value, expected, atol=1e-6), name


@pytest.mark.parametrize("traces", [(1.0, float("nan"), 2.0), (0.0, 0.0, 0.0)])
def test_undefined_fisher_traces_fall_back_to_sample_weights(data_dir, tmp_path, traces):
    server = trained_round(data_dir, tmp_path, "-jr", "0.5")
    uploaders = [c for c in server.clients if c.id in server.uploader_ids()]
    for client, trace in zip(uploaders, traces):
        client.fisher_trace = trace
    upload_current_state(server, uploaders)
    with pytest.warns(UserWarning, match="sample weights"):
        server.receive_models()
    total = sum(c.train_samples for c in uploaders)
    assert server.upload_weights == pytest.approx([c.train_samples / total for c in uploaders])
    assert server.history["rs_fisher_fallback"][-1] is True
    server.aggregate_parameters()
    assert all(torch.isfinite(t).all() for t in named_tensors(server.global_model).values())


def test_alignment_loss_sums_one_mse_per_class():
    g = torch.Generator().manual_seed(1)
    features, prototypes = torch.randn(6, 4, generator=g), torch.randn(3, 4, generator=g)
    labels = torch.tensor([2, 0, 2, 2, 1, 0])
    by_hand = sum(nn.functional.mse_loss(features[labels == k], prototypes[k].expand(int((labels == k).sum()), 4))
                  for k in range(3))
    assert torch.allclose(prototype_alignment_loss(features, labels, prototypes), by_hand)


def test_selected_clients_adopt_the_global_body_aligned_to_their_own_prototypes(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedAS", "-jr", "0.5", "-lbs", "32")
    play_round(server)  # bodies now differ from the global one
    global_before = copy.deepcopy(named_tensors(server.global_model))
    models_before = {c.id: copy.deepcopy(c.module_tensors()) for c in server.clients}
    server.selected_clients = server.select_clients()
    selected = {c.id for c in server.selected_clients}
    expected = {}
    for client in server.selected_clients:  # replay the alignment by hand, with the client's own batches
        prototypes = class_feature_stats(in_use(client).model.base, client.train_data, client.num_classes).means()
        body = copy.deepcopy(server.global_model.base)
        generator = torch.Generator()
        generator.set_state(client.generator.get_state())
        for x, y in client.train_data.train_batches(client.batch_size, generator):
            loss = prototype_alignment_loss(body(x), y, prototypes)
            grads = torch.autograd.grad(loss, list(body.parameters()))
            with torch.no_grad():
                for p, grad in zip(body.parameters(), grads):
                    p -= ALIGNMENT_LR * grad
        expected[client.id] = named_tensors(body)
    server.send_models()
    assert state_equal(named_tensors(server.global_model), global_before)  # never trained in place (#244)
    for client in server.clients:
        client.check_out()
        state = named_tensors(client.model)
        heads = [n for n in state if n.startswith("head.")]
        assert state_equal(state, models_before[client.id], heads)
        if client.id in selected:
            for name, value in named_tensors(client.model.base).items():
                assert torch.allclose(value, expected[client.id][name], atol=1e-6), (client.id, name)
            assert not state_equal(named_tensors(client.model.base), named_tensors(server.global_model.base))
        else:
            assert state_equal(state, models_before[client.id])


def test_fedas_plus_lag_personalises_body_tensors_and_keeps_heads_local(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedAS+LAG", "-m", "CNN", "-lbs", "32", "-jr", "0.5",
                        "--lag_top_k", "4")  # its head (2 tensors) counts towards K
    personal = assert_lag_composes(server, k=2)
    assert all(n.startswith("base.") for n in personal)


def test_short_run_saves_results_with_fisher_traces(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedAS", "-gr", "1", "-jr", "0.5")
    train(server)
    arrays, attrs = read_results(results_file(server))
    assert attrs["complete"] and len(arrays["rs_test_acc"]) == 2
    assert np.all(np.isfinite(arrays["rs_train_loss"])) and np.all(np.isfinite(arrays["rs_test_auc"]))
    traces = arrays["rs_fisher_trace"]
    assert traces.shape == (2, 6) and (np.isfinite(traces).sum(axis=1) == 3).all()
    assert not arrays["rs_fisher_fallback"].any()


def test_alignment_under_lag_starts_from_and_keeps_the_clients_personal_layers(data_dir, tmp_path):
    """The aligned copy holds the client's own values where X+LAG keeps layers personal: those positions
    are not replaced by the global average, and the shared ones are aligned from that model."""
    server = server_for(data_dir, tmp_path, "-algo", "FedAS", "-m", "CNN", "-lbs", "32")
    client = server.clients[0]
    perturb_all_clients(server)
    keep = frozenset({"fc1.0.weight", "fc1.0.bias"})
    own = {n: t.clone() for n, t in named_tensors(client.model.base).items()}
    # What X+LAG broadcasts when it keeps fc1 personal: the global body less that module's tensors.
    client.receive_aligned({n: t for n, t in server.broadcast().items() if n not in keep})
    after = named_tensors(client.model.base)
    assert state_equal(after, own, keep)
    # The same client without LAG aligns a copy holding the global values: its shared positions differ.
    twin_server = server_for(data_dir, tmp_path / "twin", "-algo", "FedAS", "-m", "CNN", "-lbs", "32")
    perturb_all_clients(twin_server)
    twin = twin_server.clients[0]
    twin.receive_aligned(twin_server.broadcast())
    without = named_tensors(twin.model.base)
    assert not state_equal(without, own, keep)
    assert not state_equal(after, without, set(after) - keep)  # alignment saw the personal layers
