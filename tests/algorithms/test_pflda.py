"""PFL-DA: each client's encoder trained through the shared global head, a personal head on its detached
features pulled towards the received global head; only the global head is averaged."""
import copy

import torch

from flcore.aggregation import named_tensors
from helpers import (in_use, assert_lag_composes, perturb_all_clients, play_round, server_for, state_equal, train,
                     uploads_are)
from personal_checks import accuracy_of


def test_one_backward_gives_encoder_global_head_and_personal_head_their_own_gradients(data_dir, tmp_path):
    """The defining step: the personal head learns from its own loss and the pull lamda (h - g_r) towards the
    head received this round (PFLlib's pull, on .data, has no gradient); encoder and global head only from
    the global head's loss."""
    lamda = 0.6
    server = server_for(data_dir, tmp_path, "-algo", "PFL-DA", "-lam", str(lamda))
    client = in_use(server.clients[0])
    with torch.no_grad():  # a personal head away from the global one
        client.personal_head.weight.add_(0.1)
    client.begin_local_training()
    x, y = client.train_data.x[:16], client.train_data.y[:16]
    client.model.zero_grad()
    client.personal_head.zero_grad()
    client.local_loss(x, y).backward()
    shared = list(client.model.parameters())
    ce = torch.nn.functional.cross_entropy(client.model(x), y)
    for param, expected in zip(shared, torch.autograd.grad(ce, shared)):
        assert torch.allclose(param.grad, expected, atol=1e-6)
    with torch.no_grad():
        features = client.model.base(x)
        onehot = torch.nn.functional.one_hot(y, client.num_classes).float()
        probabilities = torch.softmax(client.personal_head(features), 1)
        # The heads are linear: dCE/dW = (softmax - onehot)^T z / B; the pull adds lamda (W - W_received).
        expected_weight = (probabilities - onehot).T @ features / len(y) \
            + lamda * (client.personal_head.weight - client.received_head.weight)
        expected_bias = (probabilities - onehot).mean(0) \
            + lamda * (client.personal_head.bias - client.received_head.bias)
    assert torch.allclose(client.personal_head.weight.grad, expected_weight, atol=1e-6)
    assert torch.allclose(client.personal_head.bias.grad, expected_bias, atol=1e-6)


def test_only_the_global_head_is_averaged_and_clients_report_encoder_and_personal_head(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "PFL-DA", "-jr", "0.5")
    initial_base = copy.deepcopy(named_tensors(server.global_model.base))
    play_round(server)
    assert uploads_are(server, lambda c: c.model.head)
    by_id = {c.id: c for c in server.clients}
    total = sum(by_id[i].train_samples for i in server.uploader_ids())
    for name, value in server.global_model.head.named_parameters():
        expected = sum(dict(by_id[i].model.head.named_parameters())[name] * by_id[i].train_samples / total
                       for i in server.uploader_ids())
        assert torch.allclose(value, expected, atol=1e-6), name
    assert state_equal(named_tensors(server.global_model.base), initial_base)
    trained = by_id[server.uploader_ids()[0]]
    assert not state_equal(named_tensors(trained.personal_head), named_tensors(trained.model.head))
    summary = server.evaluate()
    assert summary.accuracy == accuracy_of(server.clients, lambda c: torch.nn.Sequential(c.model.base, c.personal_head))

    perturb_all_clients(server)
    kept = {c.id: (copy.deepcopy(named_tensors(c.model.base)), copy.deepcopy(named_tensors(c.personal_head)))
            for c in server.clients}
    server.send_models()
    for client in server.clients:
        assert state_equal(named_tensors(client.model.head), named_tensors(server.global_model.head))
        assert state_equal(named_tensors(client.model.base), kept[client.id][0])
        assert state_equal(named_tensors(client.personal_head), kept[client.id][1])


def test_pfl_da_plus_lag_ranks_only_the_global_heads_tensors(data_dir, tmp_path):
    # The encoder's 2 tensors and the personal head's 2 count towards K; one of the global head's 2 may join.
    server = server_for(data_dir, tmp_path, "-algo", "PFL-DA+LAG", "-jr", "0.5", "--lag_top_k", "5")
    personal = assert_lag_composes(server, k=1, private=lambda c: named_tensors(c.personal_head))
    assert {n for layer in server.lag_layers for n in layer.tensors} == {"head.weight", "head.bias"}
    assert len(personal) == 1


def test_a_newcomer_gets_the_global_head_a_fresh_encoder_and_a_personal_head_from_the_global_one(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "PFL-DA", "-nc", "4", "-nnc", "1", "-ften", "0", "-gr", "1")
    initial = copy.deepcopy(named_tensors(server.global_model))
    initial_base = {n[len("base."):]: t for n, t in initial.items() if n.startswith("base.")}
    train(server)
    newcomer = in_use(server.new_clients[0])
    assert state_equal(named_tensors(newcomer.model.head), named_tensors(server.global_model.head))
    assert state_equal(named_tensors(newcomer.model.base), initial_base)
    assert state_equal(named_tensors(newcomer.personal_head), named_tensors(server.global_model.head))
    assert not state_equal(named_tensors(newcomer.personal_head), {n[len("head."):]: t for n, t in initial.items()
                                                                   if n.startswith("head.")})
