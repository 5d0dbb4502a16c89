"""FedROD: balanced-softmax generic model shared whole, personal head kept on the client."""
import copy
import math

import numpy as np
import torch

from flcore.aggregation import named_tensors
from flcore.clients.clientrod import balanced_softmax_loss
from utils.result_utils import read_results
from helpers import assert_lag_composes, in_use, original_and_restored_twin, play_round, server_for, state_equal, train, results_file


def test_balanced_softmax_loss_matches_a_hand_computation():
    logits = torch.tensor([[1.0, 2.0, 0.5], [0.2, -1.0, 3.0]])
    labels = torch.tensor([0, 2])
    for counts in ([4.0, 1.0, 5.0], [4.0, 0.0, 5.0]):
        # -log(n_y e^{z_y} / sum_c n_c e^{z_c}), averaged; a class with n_c = 0 drops out of the sum.
        expected = np.mean([
            -math.log(counts[y] * math.exp(row[y]) / sum(n * math.exp(z) for n, z in zip(counts, row)))
            for row, y in zip(logits.tolist(), labels.tolist())])
        got = balanced_softmax_loss(logits, labels, torch.tensor(counts).log())
        assert math.isclose(float(got), expected, rel_tol=1e-6)


def test_one_backward_gives_each_head_its_own_gradient(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedROD")
    client = in_use(server.clients[0])
    x, y = client.train_data.x[:16], client.train_data.y[:16]
    client.model.zero_grad()
    client.personal_head.zero_grad()
    client.local_loss(x, y).backward()
    # The base learns from the balanced softmax loss alone: the personal term sees detached features.
    base = list(client.model.base.parameters())
    bsm = balanced_softmax_loss(client.model(x), y, client.log_class_counts)
    for param, expected in zip(base, torch.autograd.grad(bsm, base)):
        assert torch.allclose(param.grad, expected, atol=1e-6)
    with torch.no_grad():
        features = client.model.base(x)
        generic = client.model.head(features)
        personal = client.personal_head(features)
        onehot = torch.nn.functional.one_hot(y, generic.shape[1]).float()
        counts = torch.bincount(client.train_data.y, minlength=generic.shape[1]).float()
        # d CE / d logits = softmax - onehot; the heads are linear, so dW = (p - onehot)^T z / B.
        generic_grad = (torch.softmax(generic + counts.log(), 1) - onehot).T @ features / len(y)
        personal_grad = (torch.softmax(generic + personal, 1) - onehot).T @ features / len(y)
    assert torch.allclose(client.model.head.weight.grad, generic_grad, atol=1e-6)
    assert torch.allclose(client.personal_head.weight.grad, personal_grad, atol=1e-6)


def test_personal_head_never_reaches_the_server_and_is_used_in_evaluation(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedROD", "-jr", "0.5")
    initial = {c.id: copy.deepcopy(c.module_tensors("personal_head")) for c in server.clients}
    play_round(server)
    # The kept personal heads, read before any client is checked out (the uploads hold kept tensors).
    personal_storage = {t.data_ptr() for c in server.clients for t in c.module_tensors("personal_head").values()}
    personal_params = {id(p) for c in server.clients for p in in_use(c).personal_head.parameters()}
    for client in server.clients:
        assert not personal_params & {id(p) for p in client.model.parameters()}
    for upload in server.uploads:
        assert not personal_storage & {t.data_ptr() for t in upload.tensors.values()}
    trained = {c.id for c in server.selected_clients}
    for client in server.clients:
        unchanged = state_equal(client.module_tensors("personal_head"), initial[client.id])
        assert unchanged == (client.id not in trained), client.id

    with torch.no_grad():
        for client in server.clients:
            in_use(client).personal_head.weight.add_(0.1 * (client.id + 1))
    kept = {c.id: copy.deepcopy(c.module_tensors("personal_head")) for c in server.clients}
    server.send_models()
    global_state = named_tensors(server.global_model)
    for client in server.clients:
        assert state_equal(client.module_tensors("personal_head"), kept[client.id])
        assert state_equal(client.module_tensors(), global_state)
        client.check_out()
        x, y = client.test_data.x, client.test_data.y
        with torch.no_grad():
            features = client.model.base(x)
            logits = client.model.head(features) + client.personal_head(features)
        assert client.test_metrics().correct == int((logits.argmax(1) == y).sum())


def test_fedrod_plus_lag_keeps_the_personal_head_private(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedROD+LAG", "-m", "CNN", "--lag_top_k", "4")  # + personal head
    personal = assert_lag_composes(server, k=2, private=lambda c: named_tensors(c.personal_head))
    assert all(name.startswith(("base.", "head.")) for name in personal)


def test_a_loaded_state_continues_like_the_original(data_dir, tmp_path):
    original, twin = original_and_restored_twin(data_dir, tmp_path, "-algo", "FedROD", "-jr", "0.5")
    for a, b in zip(original.clients, twin.clients):
        assert state_equal(a.module_tensors("personal_head"), b.module_tensors("personal_head"))
        assert state_equal(a.module_tensors(), b.module_tensors())


def test_end_to_end_records_personalised_and_generic_accuracy(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedROD", "-gr", "1")
    train(server)
    arrays, attrs = read_results(results_file(server))
    assert attrs["complete"]
    assert len(arrays["rs_test_acc"]) == len(arrays["rs_generic_test_acc"]) == 2
    assert np.isfinite(arrays["rs_train_loss"]).all()
    assert ((0 <= arrays["rs_generic_test_acc"]) & (arrays["rs_generic_test_acc"] <= 1)).all()
    assert arrays["rs_test_acc"][-1] > arrays["rs_test_acc"][0]
