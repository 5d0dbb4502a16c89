"""FedBN: every tensor is averaged except those of normalisation layers, parameters and buffers alike."""
import copy

import numpy as np
import torch
from torch import nn

from flcore.aggregation import named_tensors
from flcore.clients.clientbn import normalisation_tensor_names
from utils.result_utils import read_results
from helpers import assert_lag_composes, perturb_all_clients, play_round, server_for, state_equal, train, results_file

RESNET = ("-m", "ResNet20", "-jr", "0.34", "-lbs", "32")  # two clients a round keep it quick


def test_normalisation_layers_are_recognised_by_type_not_by_name():
    model = nn.Sequential()
    model.add_module("conv", nn.Conv2d(1, 4, 3))
    model.add_module("norm", nn.BatchNorm2d(4))
    model.add_module("groups", nn.GroupNorm(2, 4))
    model.add_module("inst", nn.InstanceNorm2d(4, affine=True, track_running_stats=True))
    model.add_module("flat", nn.Flatten())
    model.add_module("layer", nn.LayerNorm(4))
    model.add_module("bn_like", nn.Linear(4, 4))  # "bn" in the name, but not a normalisation layer
    bn = {f"norm.{n}" for n in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")}
    inst = {f"inst.{n}" for n in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")}
    expected = bn | inst | {"groups.weight", "groups.bias", "layer.weight", "layer.bias"}
    assert normalisation_tensor_names(model) == expected


def test_norm_tensors_are_never_averaged_nor_broadcast_while_the_rest_is(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedBN", *RESNET)
    client = server.clients[0]
    local = client.local_tensor_names
    assert {"stem.1.running_mean", "stem.1.running_var", "stem.1.num_batches_tracked", "stem.1.weight"} <= local
    assert client.shares("stem.0.weight") and client.shares("fc.weight") and not client.shares("stem.1.bias")
    initial = copy.deepcopy(named_tensors(server.global_model))
    play_round(server)

    global_state = named_tensors(server.global_model)
    assert state_equal(global_state, initial, local), "the server changed a normalisation tensor"
    by_id = {c.id: c for c in server.clients}
    assert all(not any("stem.1" in n for n in u.tensors) for u in server.uploads)  # norms are not uploaded
    uploads = [named_tensors(by_id[i].model) for i in server.uploader_ids()]
    assert not torch.equal(uploads[0]["stem.1.running_mean"], uploads[1]["stem.1.running_mean"])
    total = sum(by_id[i].train_samples for i in server.uploader_ids())
    weights = [by_id[i].train_samples / total for i in server.uploader_ids()]
    for name in ("stem.0.weight", "layers.1.0.conv2.weight", "fc.weight", "fc.bias"):
        expected = sum(w * u[name] for w, u in zip(weights, uploads))
        assert torch.allclose(global_state[name], expected, atol=1e-6), name

    perturb_all_clients(server)
    before = {c.id: copy.deepcopy(named_tensors(c.model)) for c in server.clients}
    server.send_models()
    for c in server.clients:
        state = named_tensors(c.model)
        assert state_equal(state, before[c.id], local), f"client {c.id} lost a normalisation tensor"
        assert state_equal(state, global_state, set(state) - local), f"client {c.id} missed a shared tensor"


def test_fedbn_lag_never_ranks_normalisation_tensors(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedBN+LAG", *RESNET, "--lag_top_k", "2")
    personal = assert_lag_composes(server, k=2)
    candidates = {n for layer in server.lag_layers for n in layer.tensors}
    local = server.clients[0].local_tensor_names
    assert candidates and not candidates & local and not personal & local
    assert {n for n, _ in server.clients[0].model.named_parameters()} - local == candidates


def test_end_to_end_run_keeps_per_client_statistics(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedBN", *RESNET, "-gr", "0")
    train(server)
    arrays, _ = read_results(results_file(server))
    assert arrays["rs_test_acc"].shape == (1,) and 0 <= arrays["rs_test_acc"][0] <= 1
    assert np.all(np.isfinite(arrays["rs_train_loss"]))
    trained = [c for c in server.clients if c.model.stem[1].num_batches_tracked > 0]
    assert len(trained) == 2
    assert not torch.equal(trained[0].model.stem[1].running_var, trained[1].model.stem[1].running_var)
