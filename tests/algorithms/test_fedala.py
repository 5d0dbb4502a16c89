"""FedALA: lower layers take the global model, the top -p tensors are mixed by learned W in [0, 1]."""
import copy

import pytest
import torch
from torch.func import functional_call

from flcore.aggregation import named_tensors
from flcore.lag.conflict import with_module_buffers
from utils.errors import ConfigError
from utils.result_utils import read_results
from helpers import assert_lag_composes, in_use, play_round, server_for, train, results_file


def test_lower_layers_are_global_upper_layers_the_elementwise_mix_and_w_stays_in_0_1(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedALA", "-nc", "3", "-p", "2", "-s", "20", "-et", "3")
    play_round(server)  # clients now differ from the new global model
    local = {c.id: copy.deepcopy(c.module_tensors()) for c in server.clients}
    global_state = copy.deepcopy(named_tensors(server.global_model))
    server.send_models()
    lower, upper = ["fc1.0.weight", "fc1.0.bias"], ["fc.weight", "fc.bias"]
    assert server.clients[0].mixed_names == upper
    learned = False
    for client in server.clients:
        client.check_out()
        state = named_tensors(client.model)
        for name in lower:
            assert torch.equal(state[name], global_state[name])
        for name in upper:
            w = client.ala_weights[name]
            assert bool(((w >= 0) & (w <= 1)).all())
            mix = local[client.id][name] + (global_state[name] - local[client.id][name]) * w
            assert torch.allclose(state[name], mix, atol=1e-7)
            learned |= bool((w < 1).any() and (w > 0).any())
        assert not client.ala_start_phase
    assert learned  # W moved off its initial ones, so the mix is neither model


def test_one_weight_step_is_w_minus_eta_grad_times_the_difference_clipped(data_dir, tmp_path):
    eta = 2.0
    server = server_for(data_dir, tmp_path, "-algo", "FedALA", "-s", "40", "-et", str(eta), "-lbs", "200")
    play_round(server)
    client = in_use(server.clients[3])
    client.ala_start_phase = False  # one epoch, and -lbs covers the whole sample: exactly one step
    with torch.no_grad():
        client.ala_weights["fc.weight"].uniform_(0, 1, generator=torch.Generator().manual_seed(0))
    w0 = {n: w.clone() for n, w in client.ala_weights.items()}
    local = {n: p.detach().clone() for n, p in client.model.named_parameters()}
    received = {n: p.detach().clone() for n, p in server.global_model.named_parameters()}
    replay = torch.Generator().set_state(client.generator.get_state())
    n = len(client.train_data)
    index = torch.randperm(n, generator=replay)[:int(n * 0.4)]
    x, y = client.train_data.x[index], client.train_data.y[index]
    # By hand: the loss at theta_hat = lower global + mixed upper, its gradient in theta_hat.
    theta = {k: received[k].clone() for k in ("fc1.0.weight", "fc1.0.bias")}
    theta.update({k: (local[k] + (received[k] - local[k]) * w0[k]).requires_grad_() for k in w0})
    model = copy.deepcopy(client.model).eval()
    loss = torch.nn.functional.cross_entropy(functional_call(model, theta, (x,)), y)
    grads = dict(zip(w0, torch.autograd.grad(loss, [theta[k] for k in w0])))
    expected_w = {k: (w0[k] - eta * grads[k] * (received[k] - local[k])).clamp(0, 1) for k in w0}
    client.adaptive_local_aggregation(server.broadcast())
    for k in w0:
        assert torch.allclose(client.ala_weights[k], expected_w[k], atol=1e-6), k
        mixed = local[k] + (received[k] - local[k]) * expected_w[k]
        assert torch.allclose(dict(client.model.named_parameters())[k], mixed, atol=1e-6), k
    assert not torch.equal(expected_w["fc.weight"], w0["fc.weight"])


def test_fedala_plus_lag_keeps_personal_layers_and_w_is_learned_around_them(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedALA+LAG", "-nc", "3", "-s", "20", "--lag_top_k", "2")
    personal = assert_lag_composes(server, k=2)
    assert personal <= {n for n, _ in server.clients[0].model.named_parameters()}


def test_weights_and_start_phase_are_persistent_client_state(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedALA", "-nc", "2", "-s", "20")
    play_round(server)
    server.send_models()
    saved = server.clients[0].get_state()
    twin = server_for(data_dir, tmp_path / "twin", "-algo", "FedALA", "-nc", "2").clients[0]
    assert twin.ala_start_phase
    twin.set_state(saved)
    assert not twin.ala_start_phase
    assert all(torch.equal(in_use(twin).ala_weights[n], w) for n, w in in_use(server.clients[0]).ala_weights.items())


def test_flags_out_of_range_are_refused_by_name(data_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"-p/--layer_idx .* \[1, 4\]"):
        server_for(data_dir, tmp_path, "-algo", "FedALA", "-p", "5")
    with pytest.raises(ConfigError, match="-s/--rand_percent"):
        server_for(data_dir, tmp_path, "-algo", "FedALA", "-s", "0")


def test_two_rounds_end_to_end(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedALA", "-nc", "3", "-gr", "1", "-s", "20")
    train(server)
    arrays, _ = read_results(results_file(server))
    assert len(arrays["rs_test_acc"]) == 2 and arrays["rs_test_acc"][1] > arrays["rs_test_acc"][0]
    assert all(torch.isfinite(torch.as_tensor(arrays["rs_train_loss"])))
    w = arrays["rs_ala_weight_mean"]
    assert len(w) == 2 and w[0] == 1.0 and 0 <= w[1] < 1  # round 0 has nothing to mix; round 1 learns


def test_ala_keeps_a_personal_modules_batchnorm_statistics_while_it_learns(data_dir, tmp_path):
    """Under X+LAG a personal module's buffers stay the client's own during ALA (they are part of the
    model the client will hold), and so does the module's weight; the rest arrives from the server."""
    server = server_for(data_dir, tmp_path, "-algo", "FedALA", "-nc", "3", "-s", "20", "-m", "ResNet20",
                        "-data", "Toy3", "-nc", "4", "-p", "2")
    client = in_use(server.clients[0])
    model = client.model
    bn = next(name for name, m in model.named_modules() if isinstance(m, torch.nn.BatchNorm2d))
    keep = {f"{bn}.weight", f"{bn}.bias"}
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if buffer.is_floating_point():
                buffer.add_(1.0)   # the client's own statistics differ from the global ones
    own = {n: t.clone() for n, t in named_tensors(model).items() if n.startswith(bn + ".")}
    # What X+LAG broadcasts when it keeps that module personal: everything but its tensors and buffers.
    kept = with_module_buffers(model, sorted(keep))
    client.adaptive_local_aggregation({n: t for n, t in server.broadcast().items() if n not in kept})
    after = named_tensors(model)
    for name, value in own.items():
        assert torch.equal(after[name], value), name
    other_bn = next(n for n in after if n.endswith("running_mean") and not n.startswith(bn + "."))
    assert torch.equal(after[other_bn], named_tensors(server.global_model)[other_bn])
