"""FedCross: collaborators and cross-aggregation by hand, a round's dispatch and fusion, the FedAvg first
stage, the reported global model, a newcomer, X+LAG, the batched engine."""
import copy

import pytest
import torch

from flcore.aggregation import named_tensors
from flcore.crossaggregation import (IN_ORDER, LEAST_SIMILAR, MOST_SIMILAR, NO_COLLABORATOR, collaborators,
                                     cosine_similarities, cross_aggregate)
from utils.errors import ConfigError
from helpers import (assert_lag_composes, assert_same_training, in_use, play_round, server_for, state_equal, train,
                     train_and_compare, train_both)
from personal_checks import accuracy_of, zero_

# Model 0 is closest to 1 and farthest from 2; model 2 is closest to 1.
SIMILARITY = torch.tensor([[1.0, 0.9, 0.1],
                           [0.9, 1.0, 0.5],
                           [0.1, 0.5, 1.0]])


def test_each_strategy_picks_a_collaborator_other_than_the_model_itself():
    assert collaborators(SIMILARITY, LEAST_SIMILAR, 0) == [2, 2, 0]
    assert collaborators(SIMILARITY, MOST_SIMILAR, 0) == [1, 0, 1]
    # In turn: the offset cycles through 1 .. K-1, so every other model collaborates once in K-1 rounds.
    assert [collaborators(SIMILARITY, IN_ORDER, r) for r in range(3)] == [[1, 2, 0], [2, 0, 1], [1, 2, 0]]
    assert collaborators(torch.ones(1, 1), LEAST_SIMILAR, 0) == [NO_COLLABORATOR]


def test_cosine_similarity_reads_each_model_as_one_vector():
    models = [{"a": torch.tensor([1.0, 0.0]), "b": torch.tensor([0.0])},
              {"a": torch.tensor([1.0, 1.0]), "b": torch.tensor([0.0])},
              {"a": torch.tensor([0.0, 0.0]), "b": torch.tensor([2.0])}]
    expected = torch.tensor([[1.0, 2 ** -0.5, 0.0], [2 ** -0.5, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    assert torch.allclose(cosine_similarities(models, ["a", "b"]), expected)


def test_cross_aggregation_fuses_each_model_with_its_collaborator_as_it_was():
    models = [{"w": torch.tensor([1.0]), "n": torch.tensor(3)}, {"w": torch.tensor([5.0]), "n": torch.tensor(7)}]
    fused = cross_aggregate(models, [1, 0], alpha=0.75)
    assert torch.allclose(fused[0]["w"], torch.tensor([0.75 * 1 + 0.25 * 5]))
    assert torch.allclose(fused[1]["w"], torch.tensor([0.75 * 5 + 0.25 * 1]))  # from model 0 before its fusion
    assert int(fused[0]["n"]) == 7 and int(fused[1]["n"]) == 3
    alone = cross_aggregate(models[:1], [NO_COLLABORATOR], alpha=0.75)
    assert torch.equal(alone[0]["w"], models[0]["w"]) and alone[0]["w"] is not models[0]["w"]


@pytest.mark.parametrize("strategy", ["0", "1", "2"])
def test_a_round_trains_every_middleware_model_on_its_own_client_then_fuses_it(data_dir, tmp_path, strategy):
    server = server_for(data_dir, tmp_path, "-algo", "FedCross", "-jr", "0.5", "-ca", "0.7", "-cmss", strategy)
    assert len(server.middleware) == 3  # K = clients per round
    for slot, model in enumerate(server.middleware):  # distinct models, so a client's start names its slot
        for tensor in model.values():
            tensor.add_(0.01 * slot)
    server.selected_clients = server.select_clients()
    server.send_models()
    slots = [server.slot_of[c.id] for c in server.selected_clients]
    assert sorted(slots) == [0, 1, 2]
    for client in server.selected_clients:
        assert state_equal(client.module_tensors(), server.middleware[server.slot_of[client.id]])
    unselected = [c for c in server.clients if c not in server.selected_clients]
    assert all(state_equal(c.module_tensors(), named_tensors(server.global_model)) for c in unselected)
    server.train_clients(server.selected_clients)
    server.receive_models()
    trained = {server.slot_of[u.client_id]: copy.deepcopy(u.tensors) for u in server.uploads}
    server.aggregate_parameters()

    vectors = [torch.cat([trained[j][n].reshape(-1).double() for n, _ in server.global_model.named_parameters()])
               for j in range(3)]
    cosine = torch.tensor([[float(a @ b / (a.norm() * b.norm())) for b in vectors] for a in vectors])
    partners = server.history["fedcross_collaborators"][-1]
    assert partners == collaborators(cosine, int(strategy), 0) and all(p != j for j, p in enumerate(partners))
    for j, model in enumerate(server.middleware):
        for name, value in model.items():
            assert torch.allclose(value, 0.7 * trained[j][name] + 0.3 * trained[partners[j]][name], atol=1e-6), name
    for name, value in named_tensors(server.global_model).items():
        assert torch.allclose(value, sum(m[name] for m in server.middleware) / 3, atol=1e-6), name


def test_the_first_stage_is_fedavg_bit_for_bit(data_dir, tmp_path):
    cross = server_for(data_dir, tmp_path / "cross", "-algo", "FedCross", "-jr", "0.5", "-fsb", "5")
    fedavg = server_for(data_dir, tmp_path / "avg", "-algo", "FedAvg", "-jr", "0.5")
    train_and_compare(cross, fedavg)
    assert all(state_equal(m, named_tensors(cross.global_model)) for m in cross.middleware)
    assert "fedcross_collaborators" not in cross.history


def test_every_client_reports_the_global_model_not_the_middleware_it_holds(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedCross", "-jr", "0.5", "--val_ratio", "0.2")
    play_round(server)
    zeros = named_tensors(zero_(copy.deepcopy(server.global_model)))
    server.middleware = [{n: t.detach().clone() for n, t in zeros.items()} for _ in server.middleware]
    server.selected_clients = server.select_clients()
    server.send_models()  # the selected clients now hold all-zero middleware models
    assert all(float(p.detach().abs().sum()) == 0 for c in server.selected_clients
               for p in in_use(c).model.parameters())
    server.evaluate()
    history = server.history
    assert history["rs_test_acc"][-1] == pytest.approx(accuracy_of(server.clients, lambda c: server.global_model))
    with torch.no_grad():
        correct = sum(int((server.global_model.eval()(c.val_data.x).argmax(1) == c.val_data.y).sum())
                      for c in server.clients)
    assert history["rs_val_acc"][-1] == pytest.approx(correct / sum(len(c.val_data.y) for c in server.clients))


def test_a_newcomer_gets_the_global_model(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedCross", "-nc", "4", "-nnc", "1", "-ften", "0", "-gr", "1",
                        "-jr", "0.5")
    train(server)
    newcomer = server.new_clients[0]
    assert state_equal(newcomer.module_tensors(), named_tensors(server.global_model))
    assert all(not state_equal(newcomer.module_tensors(), m) for m in server.middleware)


def test_fedcross_plus_lag_keeps_the_personal_layers_whatever_middleware_model_arrives(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedCross+LAG", "-jr", "0.5", "--lag_top_k", "2")
    personal = assert_lag_composes(server, k=2)
    # Each client reports the global model with its own personal layers.
    client = server.selected_clients[0]
    reported = named_tensors(server.reported_model(client))
    own = named_tensors(client.model)
    assert state_equal(reported, own, personal)
    shared = [n for n in reported if n not in personal]
    assert state_equal(reported, named_tensors(server.global_model), shared)


def test_the_batched_engine_trains_the_middleware_models_as_the_sequential_loop(data_dir, tmp_path):
    assert_same_training(train_both(data_dir, tmp_path, "-algo", "FedCross"))


def test_a_strategy_outside_zero_to_two_is_refused(data_dir, tmp_path):
    with pytest.raises(SystemExit):
        server_for(data_dir, tmp_path, "-algo", "FedCross", "-cmss", "3")
    with pytest.raises(ConfigError, match=r"-ca/--fedcross_alpha .*must be in \[0, 1\]"):
        server_for(data_dir, tmp_path, "-algo", "FedCross", "-ca", "1.5")
