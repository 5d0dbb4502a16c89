"""--executor batched: the same training as --executor sequential, for every supported algorithm.

Bitwise equality cannot be required: vmap turns one client's matrix product or convolution into a
batched one over the clients (bmm, grouped convolution), whose float sums may be accumulated in
another order. The checks: after 3 rounds with -jr 0.5, every client's exported state (parameters,
buffers, optimiser and scheduler, persistent attributes) within 1e-5 absolute plus 1e-5 relative, the
generators' states identical (same batches drawn), FedLAG's personal layers identical, and the .h5
series within one test sample. On the small models here the results are in fact bit-identical, or
within a few 1e-8.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from helpers import (assert_close, assert_same_training, in_use, make_images, play_round, server_for, train,
                     train_both)
from dataset.utils.generate import PartitionOptions, build_dataset
from flcore.vmapped.schedule import BatchPlan, order_key
from flcore.vmapped.support import HEAD_THEN_BASE, MODELS, Recipe, Refused, batched_problem, recipe_of
from flcore.clients.clientavg import clientAVG
from flcore.clients.clientbase import Client
from utils.errors import ConfigError, RunError
from utils.client_data import ClientData
from app.options import parse_args, setup_problems


# (-algo, extra flags): every supported client class, and X+LAG on two of them. FedLAG with -ld: under
# -jr 0.5 clients have taken different numbers of decay steps, so a step mixes learning rates.
SUPPORTED = [
    ("FedAvg", ()), ("FedLAG", ("-ld", "-ldg", "0.5")), ("Local", ()), ("FedPer", ()), ("LG-FedAvg", ()),
    ("FedBABU", ()),
    ("FedRep", ("-pls", "2")), ("FedBN", ()), ("FedProx", ("-mu", "0.1")), ("FedDyn", ()),
    ("FedNTD", ("-bt", "1")), ("FedLC", ()), ("MOON", ("-mu", "1")), ("FedALA", ()), ("FedAS", ()),
    ("FedCAC", ("-bt", "1")), ("FedGH", ()), ("FedFomo", ()), ("IFCA", ("-ncs", "2")),
    ("CFL", ("--cfl_rule", "absolute", "--cfl_warmup", "0", "--cfl_eps1", "1e9", "--cfl_eps2", "0")),
    ("FedMTL", ()),
    ("FedRep+LAG", ("--lag_top_k", "2")), ("FedProx+LAG", ("-mu", "0.1")),
    ("FedGC", ()), ("FedPCL", ()), ("FedCross", ("-jr", "1")),
]


@pytest.mark.parametrize("algorithm, flags", SUPPORTED, ids=[a for a, _ in SUPPORTED])
def test_batched_equals_sequential(algorithm, flags, data_dir, tmp_path):
    assert_same_training(train_both(data_dir, tmp_path, "-algo", algorithm, *flags))


@pytest.mark.parametrize("flags", [("-algo", "FedAvg"), ("-algo", "FedLAG", "--lag_signal", "last_batch"),
                                   ("-algo", "MOON", "-mu", "1")], ids=["FedAvg", "FedLAG-last_batch", "MOON"])
def test_batched_equals_sequential_on_the_cnn(flags, data_dir, tmp_path):
    """FedAvgCNN: vmapped convolutions (forced: on a CPU the automatic choice trains a convolutional model
    one client at a time); FedLAG's last_batch signal reads the .grad the engine fills."""
    runs = train_both(data_dir, tmp_path, *flags, "-m", "CNN", "--batch_clients", "3")
    assert_same_training(runs)
    if "last_batch" in flags:  # the gradients the engine leaves are those the loop leaves
        (sequential, _), (batched, _) = runs["sequential"], runs["batched"]
        for client in batched.selected_clients:
            assert_close(batched.lag_update_of(client.id), sequential.lag_update_of(client.id), f"client {client.id}")


def test_on_a_cpu_a_convolutional_model_trains_one_client_at_a_time_unless_forced(data_dir, tmp_path, capsys):
    from flcore.executors.vmapped import BatchedExecutor
    runs = train_both(data_dir, tmp_path, "-algo", "FedAvg", "-m", "CNN")
    assert "trains this convolutional model one client at a time" in capsys.readouterr().out
    (_, sequential), (_, batched) = runs["sequential"], runs["batched"]
    for name in set(sequential) - {"rs_round_time"}:  # the sequential path itself: bit for bit
        assert np.asarray(sequential[name]).tobytes() == np.asarray(batched[name]).tobytes(), name
    cnn = runs["batched"][0]
    assert not BatchedExecutor(cnn, batch_clients=3).one_at_a_time
    assert not BatchedExecutor(server_for(data_dir, tmp_path / "dnn", "--executor", "batched")).one_at_a_time


@pytest.mark.parametrize("model, batch_clients", [("DNN", 0), ("CNN", 4)])
def test_batched_evaluation_equals_each_clients_own(model, batch_clients, data_dir, tmp_path, monkeypatch):
    """Every client's correct count, AUC and summed train loss from the vmapped evaluation against its own
    test_metrics / train_metrics, after a round has made the clients' models differ: chunks of 7 rows (the
    clients' 26-91 samples end in different chunks), at most 2 clients per forward, groups of 4 (CNN).
    Each split is gathered on the device once, not once per evaluation."""
    from flcore.vmapped import evaluation
    from flcore.executors.vmapped import BatchedExecutor
    from flcore.clients import clientbase
    from flcore.executors.sequential import evaluate_in_turn
    monkeypatch.setattr(clientbase, "EVAL_BATCH_SIZE", 7)
    monkeypatch.setattr(evaluation, "EVAL_BATCH_SIZE", 7)
    monkeypatch.setattr(evaluation, "ROWS_PER_FORWARD", 14)
    groups, outputs = [], evaluation._outputs

    def counted(stacked, net, data, clients, everyone):
        groups.append(len(clients))
        return outputs(stacked, net, data, clients, everyone)
    monkeypatch.setattr(evaluation, "_outputs", counted)
    server = server_for(data_dir, tmp_path, "-m", model, "-jr", "1", "--executor", "batched")
    play_round(server)
    executor = BatchedExecutor(server, batch_clients)
    batched = executor.evaluate_clients(server.clients)
    gathered = executor.test_data.x
    again = executor.evaluate_clients(server.clients)
    in_turn = evaluate_in_turn(server.clients)
    per_call = [6, 6] if batch_clients == 0 else [4, 4, 2, 2]  # (test, train) of each group
    assert groups == per_call * 2
    assert executor.test_data.x is gathered
    assert len({c.test_samples for c in server.clients}) > 1 and max(c.test_samples for c in server.clients) > 14
    for ours, theirs, repeat in zip(batched, in_turn, again):
        assert ours == repeat
        assert (ours.test.correct, ours.test.num_samples, ours.train_samples) == \
            (theirs.test.correct, theirs.test.num_samples, theirs.train_samples)
        assert math.isclose(ours.test.auc, theirs.test.auc, rel_tol=1e-6)
        assert math.isclose(ours.train_loss_sum, theirs.train_loss_sum, rel_tol=1e-5)


def test_evaluation_falls_back_to_each_clients_own_where_it_differs(data_dir, tmp_path):
    """A client class with its own evaluation (FedProto: nearest prototype) or models of different shapes
    are evaluated client by client."""
    from flcore.vmapped.evaluation import evaluates_as_base, same_structure
    from flcore.clients.clientproto import clientProto
    assert evaluates_as_base(clientAVG) and not evaluates_as_base(clientProto)
    server = server_for(data_dir, tmp_path, "-m", "DNN")
    models = [in_use(c).model for c in server.clients]
    assert same_structure(models)
    assert not same_structure(models[:1] + [torch.nn.Linear(2, 2)])


def test_ragged_epochs_small_clients_groups_and_decay(data_dir, tmp_path):
    """Batch 32 over clients of 26 to 91 samples: 1 to 2 batches per epoch, two clients smaller than a
    batch (each one batch of all its samples, of its own size); two stages (FedRep), two epochs each,
    -ld, and groups of 4 clients."""
    runs = train_both(data_dir, tmp_path, "-algo", "FedRep", "-m", "CNN", "-jr", "1", "-lbs", "32", "-ls", "2",
                      "-pls", "2", "-ld", "-ldg", "0.9", "--batch_clients", "4")
    sizes = sorted(len(c.train_data) for c in runs["batched"][0].clients)
    assert sizes[0] < 32 and sizes[1] < 32 and sizes[0] != sizes[1] and sizes[-1] >= 64
    assert_same_training(runs)
    lr = in_use(runs["batched"][0].clients[0]).optimizer.param_groups[0]["lr"]
    assert lr == pytest.approx(0.05 * 0.9 ** 3)


def test_plan_draws_exactly_the_batches_of_train_batches():
    """Every client's rows, step by step, are train_batches' batches; the generators end where they would."""
    class Fake:
        def __init__(self, i, n):
            self.id, self.batch_size = i, 10
            self.train_data = ClientData(torch.arange(n, dtype=torch.float32).view(n, 1), torch.arange(n))
            self.generator = torch.Generator().manual_seed(i)
    clients = sorted([Fake(i, n) for i, n in enumerate((7, 35, 20, 3, 19, 7))], key=order_key)
    offsets = np.cumsum([0] + [len(c.train_data) for c in clients])[:-1].tolist()
    plan = BatchPlan(clients, 2, 10, offsets, torch.device("cpu"))
    assert [len(c.train_data) for c in clients] == [35, 20, 19, 3, 7, 7]
    assert plan.steps == [6, 4, 2, 2, 2, 2] and plan.sizes == [10, 10, 10, 3, 7, 7]
    assert plan.groups(0) == ((0, 3, 10), (3, 4, 3), (4, 6, 7)) and plan.groups(2) == ((0, 2, 10),)
    for i, client in enumerate(clients):
        twin = torch.Generator().manual_seed(client.id)
        expected = [y for _ in range(2) for _, y in client.train_data.train_batches(10, twin)]
        got = [plan.index[t, i, :plan.sizes[i]] - offsets[i] for t in range(plan.steps[i])]
        assert len(got) == len(expected) and all(torch.equal(g, e) for g, e in zip(got, expected))
        assert torch.equal(twin.get_state(), client.generator.get_state())
    active = [sum(e - a for a, e, _ in plan.groups(t)) for t in range(plan.num_steps)]
    assert active == [6, 6, 2, 2, 1, 1]


@pytest.fixture(scope="module")
def rgb_dir(tmp_path_factory):
    """Four clients of 8x8 RGB images, for the models with BatchNorm."""
    root = tmp_path_factory.mktemp("rgb")
    x, y = make_images(64, shape=(3, 8, 8), num_classes=3)
    build_dataset(root / "Toy", x, y, PartitionOptions(num_clients=4, partition="dir", alpha=1.0, min_samples=12))
    return root


@pytest.mark.parametrize("model", ["ResNet9", "CNN-BN"])
def test_batch_statistics_per_client(rgb_dir, tmp_path, model):
    """BatchNorm in train mode normalises each client's batch with its own statistics and updates its own
    running statistics (stacked buffers under vmap; CNN-BN's BatchNorm1d alike). In float64: ResNet9 on
    batches of 5 tiny images is chaotic (a 1e-7 change of the starting weights moves some running
    variances by 1 within 4 steps at -lr 0.05), so float32 rounding differences would hide a real
    mistake; in float64 the two agree to about 1e-9 after an epoch, while a wrong statistic would differ
    at once by far more."""
    import copy
    from flcore.executors.vmapped import BatchedExecutor
    server = server_for(rgb_dir, tmp_path, "-algo", "FedBN", "-nc", "4", "-m", model, "-lr", "0.05",
                        "-lbs", "5", "-ls", "1")
    for client in server.clients:
        client.check_out()
        client.model.double()
        client.train_data.x = client.train_data.x.double()
    start = [copy.deepcopy(c.get_state()) for c in server.clients]
    for client in server.clients:
        client.train()
    sequential = [c.get_state() for c in server.clients]
    for client, state in zip(server.clients, start):
        client.set_state(state)
    BatchedExecutor(server, batch_clients=4).train(server.clients)
    assert sorted(len(c.train_data) for c in server.clients)[0] < 10  # ragged: 1 to 3 batches
    for client, expected in zip(server.clients, sequential):
        assert_close(expected, client.get_state(), f"client {client.id}")  # generator state included


def test_divergence_is_reported_for_the_same_client(data_dir, tmp_path):
    messages = {}
    for executor in ("sequential", "batched"):
        server = server_for(data_dir, tmp_path / executor, "-lr", "1e30", "-jr", "1", "--executor", executor)
        with pytest.raises(RunError) as err:
            train(server)
        messages[executor] = str(err.value).split(". Results so far")[0]
    assert "non-finite loss" in messages["batched"] and messages["batched"] == messages["sequential"]


@pytest.mark.parametrize("flags, reason", [
    (("-algo", "Ditto"), "--executor batched cannot train Ditto: it trains a second, personal model"),
    (("-algo", "SCAFFOLD+LAG"), "--executor batched cannot train SCAFFOLD+LAG: every step is followed by"),
    (("-algo", "FedAvg", "-m", "AlexNet"), "--executor batched cannot train -m AlexNet: it has dropout layers"),
])
def test_unsupported_combinations_are_refused_before_any_data_is_read(flags, reason):
    problems, _ = setup_problems(parse_args([*flags, "--executor", "batched"]))
    assert len(problems) == 1 and problems[0].startswith(reason), problems
    assert problems[0].endswith("run it with --executor sequential") and "\n" not in problems[0]
    assert batched_problem("FedAvg", "CNN") is None
    assert setup_problems(parse_args([*flags]))[0] == []  # sequential: fine


def test_a_server_refuses_an_unsupported_algorithm_at_its_first_round(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "SCAFFOLD", "--executor", "batched")
    with pytest.raises(ConfigError, match="cannot train SCAFFOLD: .*control-variate.*--executor sequential"):
        train(server)


def client_classes():
    """Every client class defined in ``flcore/clients`` (the base class aside), by name."""
    import importlib
    import pkgutil

    import flcore.clients as package
    found = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"flcore.clients.{info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Client) and value.__module__ == module.__name__ \
                    and value is not Client:
                found[f"{info.name}.{value.__qualname__}"] = value
    return found


def test_every_client_class_and_model_is_declared():
    from flcore.trainmodel.models import MODELS as ALL_MODELS
    for key, cls in client_classes().items():
        assert isinstance(vars(cls).get("batched"), (Recipe, Refused)), f"{key} declares no batched support"
        assert "not declared" not in str(recipe_of(cls))
    assert set(MODELS) == set(ALL_MODELS)


def test_declared_classes_train_as_their_recipe_says():
    """A supported class may not take steps the engine does not reproduce: its train loop, step hook and
    optimiser are the base class's (FedRep: the two-stage loop), and its loss is its ``objective`` (the
    one the engine runs), not a ``local_loss`` of its own."""
    for key, cls in client_classes().items():
        entry = recipe_of(cls)
        if not isinstance(entry, Recipe):
            continue
        assert cls.run_epochs is Client.run_epochs and cls.after_step is Client.after_step, key
        assert cls.make_optimizer is Client.make_optimizer, key
        assert cls.train is Client.train, key
        assert cls.local_training is Client.local_training or entry is HEAD_THEN_BASE, key
        assert cls.local_loss is Client.local_loss, key

    class Custom(clientAVG):
        def local_loss(self, x, y):
            return super().local_loss(x, y) * 2
    assert "not declared" in recipe_of(Custom)
