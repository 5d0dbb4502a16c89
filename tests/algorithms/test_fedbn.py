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
    uploads = [by_id[i].module_tensors() for i in server.uploader_ids()]
    assert not torch.equal(uploads[0]["stem.1.running_mean"], uploads[1]["stem.1.running_mean"])
    total = sum(by_id[i].train_samples for i in server.uploader_ids())
    weights = [by_id[i].train_samples / total for i in server.uploader_ids()]
    for name in ("stem.0.weight", "layers.1.0.conv2.weight", "fc.weight", "fc.bias"):
        expected = sum(w * u[name] for w, u in zip(weights, uploads))
        assert torch.allclose(global_state[name], expected, atol=1e-6), name

    perturb_all_clients(server)
    before = {c.id: copy.deepcopy(c.module_tensors()) for c in server.clients}
    server.send_models()
    for c in server.clients:
        state = c.module_tensors()
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
    trained = [c for c in server.clients if c.module_tensors()["stem.1.num_batches_tracked"] > 0]
    assert len(trained) == 2
    assert not torch.equal(trained[0].module_tensors()["stem.1.running_var"],
                           trained[1].module_tensors()["stem.1.running_var"])


# ----- -m CNN-BN: FedAvgCNN with BatchNorm, FedBN's model for small images -----
def test_cnn_bn_is_fedavgcnn_with_a_batchnorm_after_each_convolution_and_the_hidden_layer():
    from flcore.trainmodel.models import build_model
    torch.manual_seed(0)
    plain = build_model("CNN", (1, 8, 8), 10)
    torch.manual_seed(0)
    normed = build_model("CNN-BN", (1, 8, 8), 10)
    norms = {name: (type(m).__name__, m.num_features) for name, m in normed.named_modules()
             if isinstance(m, nn.modules.batchnorm._NormBase)}
    assert norms == {"conv1.1": ("BatchNorm2d", 32), "conv2.1": ("BatchNorm2d", 64), "fc1.1": ("BatchNorm1d", 512)}
    normed_parameters = dict(normed.named_parameters())
    for name, tensor in plain.named_parameters():   # CNN's layers under their names, drawn from the same stream
        assert torch.equal(normed_parameters[name], tensor), name
    assert all(int(m.num_batches_tracked) == 0 for m in normed.modules() if hasattr(m, "num_batches_tracked"))
    x = torch.randn(4, 1, 8, 8)
    with torch.no_grad():   # fresh statistics (mean 0, var 1, unit scale): each norm divides by sqrt(1 + eps)
        assert torch.allclose(normed.eval()(x), plain.eval()(x), atol=1e-4)
    assert not torch.allclose(normed.train()(x), plain(x), atol=1e-2)   # training normalises the batch


def test_fedbn_keeps_every_batchnorm_tensor_of_cnn_bn_personal(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedBN", "-m", "CNN-BN", "-jr", "0.34", "-lbs", "8")
    local = server.clients[0].local_tensor_names
    assert local == {f"{layer}.{n}" for layer in ("conv1.1", "conv2.1", "fc1.1")
                     for n in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")}
    initial = copy.deepcopy(named_tensors(server.global_model))
    play_round(server)
    global_state = named_tensors(server.global_model)
    assert state_equal(global_state, initial, local) and not state_equal(global_state, initial)
    assert all(not set(u.tensors) & local for u in server.uploads)
    by_id = {c.id: c for c in server.clients}
    first, second = (by_id[i].module_tensors() for i in server.uploader_ids())
    assert not torch.equal(first["fc1.1.running_mean"], second["fc1.1.running_mean"])
    perturb_all_clients(server)
    before = {c.id: copy.deepcopy(c.module_tensors()) for c in server.clients}
    server.send_models()
    for c in server.clients:
        state = c.module_tensors()
        assert state_equal(state, before[c.id], local) and state_equal(state, global_state, set(state) - local)


def test_fedbn_with_cnn_bn_runs_from_the_command_line_on_digits(tmp_path):
    import main
    flags = ["-algo", "FedBN", "-m", "CNN-BN", "-data", "Digits", "--threads", "1", "-dev", "cpu",
             "--data_dir", str(tmp_path), "--results_dir", str(tmp_path)]
    assert main.main([*flags, "-gr", "1"]) == 0
    arrays, _ = read_results(tmp_path / "Digits_FedBN_test_0.h5")
    assert arrays["rs_test_acc"].shape == (2,) and np.isfinite(arrays["rs_train_loss"]).all()


def test_cnn_bn_refuses_batches_of_one_sample_in_one_line(data_dir, tmp_path, capsys):
    import main
    code = main.main(["-algo", "FedBN", "-m", "CNN-BN", "-data", "Toy", "-nc", "6", "-lbs", "1", "-gr", "0",
                      "-dev", "cpu", "--data_dir", str(data_dir), "--results_dir", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["error: -m CNN-BN normalises over each minibatch and needs -lbs 2 or more, got 1"]
