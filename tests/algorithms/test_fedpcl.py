"""FedPCL: the prototype-wise contrastive loss by hand, local prototypes up, the global prototypes and the
bank down, inference by the most similar local prototype, a first round that only measures, a newcomer."""
import math

import pytest
import torch
import torch.nn.functional as F

from flcore.aggregation import named_tensors
from flcore.clients import clientpcl
from flcore.clients.clientpcl import prototype_contrastive_loss
from flcore.registry import UnknownAlgorithmError, resolve
from flcore.servers.serverpcl import prototype_bank
from flcore.training.classvectors import ClassVectors, average_over_holders
from utils.result_utils import read_results
from helpers import in_use, play_round, results_file, server_for, state_equal, train


def test_fedpcl_plus_lag_is_refused_because_nothing_is_shared():
    with pytest.raises(UnknownAlgorithmError, match="prototypes"):
        resolve("FedPCL+LAG")


def test_loss_is_the_global_set_plus_the_mean_of_the_client_sets_each_a_softmax_over_its_prototypes():
    tau = 0.5
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    y = torch.tensor([0, 2])
    bank = torch.tensor([[[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]],      # global: classes 0 and 2
                         [[0.5, 0.5], [1.0, 1.0], [0.0, 0.0]],      # a client holding 0 and 1
                         [[1.0, 0.0], [0.0, 1.0], [0.5, 0.0]]])     # a client holding all three
    present = torch.tensor([[True, False, True], [True, True, False], [True, True, True]])

    def nll(scores, label):  # -log softmax over the listed scores, the label's first
        return -math.log(math.exp(scores[label] / tau) / sum(math.exp(s / tau) for s in scores.values()))
    global_set = (nll({0: 1.0, 2: 0.0}, 0) + nll({0: 0.0, 2: 1.0}, 2)) / 2
    first = nll({0: 0.5, 1: 1.0}, 0) / 2               # the sample of class 2 has no prototype there: 0
    second = (nll({0: 1.0, 1: 0.0, 2: 0.5}, 0) + nll({0: 0.0, 1: 1.0, 2: 0.0}, 2)) / 2
    loss = prototype_contrastive_loss(z, y, bank, present, tau)
    assert loss.item() == pytest.approx(global_set + (first + second) / 2, rel=1e-6)
    # Without any prototype there is nothing to learn from, and no NaN.
    empty = prototype_contrastive_loss(z.requires_grad_(True), y, bank[:1], torch.zeros(1, 3, dtype=torch.bool), tau)
    assert empty.item() == 0.0 and torch.equal(torch.autograd.grad(empty, z)[0], torch.zeros_like(z))


def test_bank_fills_each_clients_missing_classes_with_the_global_prototypes():
    global_prototypes = ClassVectors(torch.tensor([[1.0, 1.0], [2.0, 2.0], [0.0, 0.0]]),
                                     torch.tensor([True, True, False]))
    sets = ClassVectors(torch.tensor([[[7.0, 7.0], [0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [8.0, 8.0], [9.0, 9.0]]]),
                        torch.tensor([[True, False, False], [False, True, True]]))
    bank = prototype_bank(global_prototypes, sets)
    assert torch.equal(bank.vectors, torch.tensor([[[1.0, 1.0], [2.0, 2.0], [0.0, 0.0]],
                                                   [[7.0, 7.0], [2.0, 2.0], [0.0, 0.0]],
                                                   [[1.0, 1.0], [8.0, 8.0], [9.0, 9.0]]]))
    assert bank.present.tolist() == [[True, True, False], [True, True, False], [True, True, True]]


def unit_class_means(client) -> ClassVectors:
    model = in_use(client).model
    with torch.no_grad():
        model.eval()
        features = F.normalize(model.base(client.train_data.x), dim=1)
    held = torch.bincount(client.train_data.y, minlength=client.num_classes) > 0
    means = torch.stack([features[client.train_data.y == k].mean(0) if held[k] else torch.zeros(features.shape[1])
                         for k in range(client.num_classes)])
    return ClassVectors(means, held)


def test_first_round_only_measures_then_the_server_keeps_every_clients_latest_prototypes(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedPCL", "-jr", "0.5")
    initial = {c.id: {n: t.clone() for n, t in c.module_tensors().items()} for c in server.clients}
    play_round(server)
    first = set(server.uploader_ids())
    for client in server.clients:  # an empty bank: the loss is 0 and no parameter moves
        assert state_equal(client.module_tensors(), initial[client.id])
    for update in server.uploads:
        expected = unit_class_means(server.clients[update.client_id])
        sent = update.extras["class_vectors"]
        assert torch.equal(sent.present, expected.present)
        assert torch.allclose(sent.vectors, expected.vectors, atol=1e-5)
    play_round(server)  # now every selected client trains against the bank
    assert any(not state_equal(c.module_tensors(), initial[c.id]) for c in server.selected_clients)
    uploaded = sorted(first | set(server.uploader_ids()))
    assert server.client_present.any(dim=1).nonzero().flatten().tolist() == uploaded
    for update in server.uploads:
        assert torch.equal(server.client_vectors[update.client_id], update.extras["class_vectors"].vectors)
    pooled = average_over_holders([ClassVectors(server.client_vectors[i], server.client_present[i]) for i in uploaded])
    assert torch.allclose(server.global_vectors, pooled.vectors) and torch.equal(server.global_present, pooled.present)
    server.send_models()
    for client in server.clients:
        assert client.prototype_bank.shape[0] == 1 + len(uploaded)
        assert torch.equal(client.prototype_bank[0], server.global_vectors)


def test_a_client_is_classified_by_its_most_similar_local_prototype_not_by_the_head(data_dir, tmp_path):
    tau = 0.2
    server = server_for(data_dir, tmp_path, "-algo", "FedPCL", "-tau", str(tau))
    client = in_use(server.clients[0])
    assert client.test_metrics().correct == 0  # no prototype yet: nothing is predicted
    client.measure_local_prototypes()
    with torch.no_grad():
        client.model.eval()
        features = F.normalize(client.model.base(client.test_data.x), dim=1)
        scores = features @ client.prototype_vectors.T
        scores[:, ~client.prototype_present] = float("-inf")
        client.model.head.weight.zero_()  # a head that answers class 0 whatever it sees changes nothing
        client.model.head.bias.copy_(torch.arange(client.num_classes, 0, -1, dtype=torch.float32))
    expected = int((scores.argmax(dim=1) == client.test_data.y).sum())
    assert client.test_metrics().correct == expected > int((client.test_data.y == 0).sum())
    assert torch.allclose(client.evaluation_model()(client.test_data.x), scores / tau)


def test_a_short_run_learns(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedPCL", "-gr", "3", "-jr", "1")
    train(server)
    acc = read_results(results_file(server))[0]["rs_test_acc"]
    assert acc[0] == 0.0 and acc[-1] > 0.6  # 4 classes: chance is 0.25


def test_newcomer_trains_against_the_bank_and_is_classified_by_its_own_prototypes(data_dir, tmp_path, monkeypatch):
    server = server_for(data_dir, tmp_path, "-algo", "FedPCL", "-nc", "4", "-nnc", "1", "-gr", "1", "-jr", "1")
    initial = {n: t.clone() for n, t in server.clients[0].module_tensors().items()}
    for _ in range(2):
        play_round(server)
    newcomer = in_use(server.set_clients([4])[0])
    server.receive_new_client(newcomer)
    assert state_equal(named_tensors(newcomer.model), initial)  # no parameters travel
    expected = server.class_vector_payload()
    calls = []
    original = clientpcl.prototype_contrastive_loss
    monkeypatch.setattr(clientpcl, "prototype_contrastive_loss",
                        lambda *args: calls.append(args) or original(*args))
    newcomer.fine_tune(1)
    assert calls and all(torch.equal(bank, expected.vectors) and torch.equal(present, expected.present)
                         for _, _, bank, present, _ in calls)
    assert not state_equal(named_tensors(newcomer.model), initial)
    assert torch.equal(newcomer.prototype_present, unit_class_means(newcomer).present)
    assert torch.allclose(newcomer.prototype_vectors, unit_class_means(newcomer).vectors, atol=1e-5)
