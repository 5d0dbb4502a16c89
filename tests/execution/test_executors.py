"""Executors: Ray workers give the sequential run's arrays bit for bit; state moves in place."""
import copy
import pickle

import numpy as np
import pytest
import torch

import app.run
from flcore.aggregation import named_tensors
from flcore.executors.client_worker import ClientWorker, worker_arguments
from flcore.executors.sequential import SequentialExecutor
from flcore.executors.shipping import SharedTable, ship, train_shipped
from flcore.registry import valid_names
from utils.result_utils import read_results
from helpers import in_use, method_flags, server_for, state_equal, train, results_file

TIMING = {"rs_round_time"}


def worker_copy(table: SharedTable) -> SharedTable:
    """The table as a worker has it: its tensors and templates pickled and read back."""
    return SharedTable(*pickle.loads(pickle.dumps((table.tensors, table.templates))))


def trained_elsewhere(clients, keep_gradients=True):
    """Train each client as a Ray worker does: shipped against a copy of the round's table, trained there,
    its state and update shipped back; returns ``(state, update)`` per client, read on the server's side."""
    table, packed = ship(clients)
    worker = worker_copy(table)
    for client in clients:
        assert client.is_parked()
    results = []
    for client, blob in zip(clients, packed):
        copied = worker.loads(blob)
        assert copied.train_data is None and client.train_data is not None
        copied.train_data, copied.test_data = client.train_data, client.test_data
        results.append(table.loads(worker.dumps(train_shipped(copied, keep_gradients))))
    return results


def test_a_client_trained_elsewhere_comes_back_by_its_state_and_its_update(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "SCAFFOLD")
    client = server.clients[0]
    before = copy.deepcopy(client.get_state())
    (state, update), = trained_elsewhere([client], keep_gradients=False)
    # The same training in this process, from the same state.
    here = server_for(data_dir, tmp_path / "here", "-algo", "SCAFFOLD").clients[0]
    here.set_state(before)
    here.check_out()
    expected = here.train().without_gradients()
    client.set_state(state)
    client.check_out()
    model, optimizer = client.model, client.optimizer
    assert client.optimizer.param_groups[0]["params"][0] is next(client.model.parameters())
    assert model is client.model and optimizer is client.optimizer
    assert state_equal(named_tensors(client.model), named_tensors(here.model))
    assert torch.equal(client.generator.get_state(), here.generator.get_state())
    assert state_equal(client.control_delta, here.control_delta)
    # The update is the trained shared tensors and the control delta; gradients stay behind unless asked.
    assert update.client_id == 0 and update.num_samples == client.train_samples and update.gradients == {}
    assert state_equal(update.tensors, expected.tensors)
    assert state_equal(update.extras["control_delta"], expected.extras["control_delta"])
    assert client.train_data is not None  # the server's copy keeps its data
    client.park()
    assert trained_elsewhere([client], keep_gradients=True)[0][1].gradients


def test_shared_tensors_travel_once_per_round_and_own_ones_with_their_client(data_dir, tmp_path):
    """FedPer after a broadcast: the base is every client's (in the table once), each head its own (in its
    client's pickle only); what training leaves unchanged comes back as a name, not a copy."""
    server = server_for(data_dir, tmp_path, "-algo", "FedPer", "-nc", "4", "-jr", "1")
    train(server)
    server.send_models()  # heads trained: each client owns its head, the base is the latest broadcast
    clients = server.clients
    table, packed = ship(clients)
    model_bytes = sum(t.numel() * t.element_size() for t in clients[0].module_tensors().values())
    head = dict(in_use(clients[0]).model.head.named_parameters())
    head_bytes = sum(t.numel() * t.element_size() for t in head.values())
    shared_bytes = sum(t.numel() * t.element_size() for t in table.tensors)
    assert model_bytes - head_bytes <= shared_bytes < model_bytes  # the base, once, for 4 clients
    whole = SharedTable([], table.templates)  # names the templates only: every tensor travels
    base_bytes = model_bytes - head_bytes
    for client, blob in zip(clients, packed):
        assert len(whole.dumps(client.detached())) - len(blob) >= base_bytes
        copied = worker_copy(table).loads(blob)
        assert head_bytes <= sum(t.numel() * t.element_size() for t in copied.own_tensors().values())
        assert state_equal(copied.module_tensors(), client.module_tensors())
    # What a worker parks unchanged goes back as a name: the base here (nothing trained it).
    worker = worker_copy(table)
    copied = worker.loads(packed[0])
    copied.park()
    returned = worker.dumps(copied.get_state())
    assert len(SharedTable([], []).dumps(copied.get_state())) - len(returned) >= base_bytes
    state = table.loads(returned)
    tensors, = state["model"].values()  # the module's tensors, as get_state exports them
    base = {k: v for k, v in tensors.items() if not k.startswith("head.")}
    assert base and all(any(v is t for t in table.tensors) for v in base.values())


class Elsewhere(SequentialExecutor):
    """Trains and evaluates each client as a worker process or a Ray actor does - a
    :class:`ClientWorker` given a pickled copy of the batch's table, the client shipped without its data -
    but in this process, so that every algorithm is cheap to check; brings back only each client's state
    and update, or its evaluation."""

    def __init__(self, server):
        super().__init__()
        self.worker, self.key = ClientWorker(*worker_arguments(server)), 0

    def _shipped(self, clients):
        table, packed = ship(clients)
        self.key += 1
        self.worker.hold(self.key, pickle.dumps(table.tensors), pickle.dumps(table.templates))
        return table, packed

    def train(self, clients):
        table, packed = self._shipped(clients)
        results = [table.loads(self.worker.train(blob, self.key)) for blob in packed]
        for client, (state, _) in zip(clients, results):
            client.set_state(state)
            client.park()
        return [update for _, update in results]

    def evaluate_clients(self, clients, model_of=None):
        if model_of is not None:  # Ditto's global model: in the server's process, as every executor does
            return super().evaluate_clients(clients, model_of)
        _, packed = self._shipped(clients)
        return [pickle.loads(self.worker.evaluate(blob, self.key)) for blob in packed]


ELSEWHERE = [name for name in valid_names() if not name.endswith("+LAG")] + ["FedRep+LAG", "FedAS+LAG"]


@pytest.mark.parametrize("name", ELSEWHERE)
def test_every_algorithm_trained_and_evaluated_elsewhere_equals_sequential(name, data_dir, tmp_path, monkeypatch):
    """The contract every executor relies on: a client's declared state and its update carry everything
    the server reads after training (aggregation, per-round records, evaluation after training), and a
    client's state, shipped, everything its evaluation reads."""
    flags = ("-algo", name, "-nc", "4", "-jr", "0.5", "-gr", "1", "--eval_after_training", *method_flags(name))
    sequential = server_for(data_dir, tmp_path / "sequential", *flags)
    train(sequential)
    monkeypatch.setattr(app.run, "make_executor", lambda server, config: Elsewhere(server))
    elsewhere = server_for(data_dir, tmp_path / "elsewhere", *flags)
    train(elsewhere)
    expected, found = (read_results(results_file(s))[0] for s in (sequential, elsewhere))
    assert set(found) == set(expected)
    for array in set(expected) - TIMING:
        a, b = found[array], expected[array]
        same = a.tolist() == b.tolist() if a.dtype == object else np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
        assert same, array


@pytest.mark.xdist_group("ray")  # the worker that runs the other Ray tests (tests/execution/test_ray_failures.py)
@pytest.mark.parametrize("algorithm", ["FedLAG", "SCAFFOLD"])
def test_ray_with_two_workers_equals_sequential(algorithm, ray_session, data_dir, tmp_path, monkeypatch):
    """Across processes: FedLAG (the mixin's scoring on updates that arrive as copies) and SCAFFOLD (an
    upload with extras). That each algorithm's state and update carry what the server reads is checked for
    every algorithm, in one process, by the test above."""
    arrays, made = {}, []
    make_executor = app.run.make_executor
    monkeypatch.setattr(app.run, "make_executor", lambda *args: made.append(make_executor(*args)) or made[-1])
    for executor in ("sequential", "ray"):
        server = server_for(data_dir, tmp_path / executor, "-algo", algorithm, "-m", "CNN", "-jr", "0.5",
                            "-gr", "3", "--executor", executor, "--workers", "2")
        train(server)
        arrays[executor] = read_results(results_file(server))[0]
    assert set(arrays["ray"]) == set(arrays["sequential"])
    for name in set(arrays["ray"]) - TIMING:
        assert np.array_equal(arrays["ray"][name], arrays["sequential"][name]), name
    # The last round's shared tensors (the broadcast, SCAFFOLD's control) went once to each worker that
    # trained a client, not once per client; FedLAG's clients carried little more than their heads.
    model = sum(t.numel() * t.element_size() for t in server.global_model.state_dict().values())
    sent, trained = made[-1].sent_bytes, len(server.selected_clients)
    workers = len({c.id % 2 for c in server.selected_clients})
    assert trained == 3 and sent["tables"] == workers and sent["shared"] >= workers * model / 2
    assert algorithm != "FedLAG" or sent["clients"] < trained * model / 2
