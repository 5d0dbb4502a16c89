"""Executors: Ray workers give the sequential run's arrays bit for bit; state moves in place."""
import copy

import numpy as np
import pytest
import torch

import app.run
from flcore.aggregation import named_tensors
from flcore.executors.sequential import SequentialExecutor, train_detached, without_data
from flcore.registry import valid_names
from utils.result_utils import read_results
from helpers import method_flags, server_for, state_equal, train, results_file

TIMING = {"rs_round_time"}


def test_a_client_trained_elsewhere_comes_back_by_its_state_and_its_update(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "SCAFFOLD")
    client = server.clients[0]
    model, optimizer = client.model, client.optimizer
    shipped = copy.deepcopy(without_data(client))
    assert shipped.train_data is None and client.train_data is not None
    shipped.train_data, shipped.test_data = client.train_data, client.test_data
    state, update = train_detached(shipped, keep_gradients=False)
    client.set_state(state)
    assert client.model is model and client.optimizer is optimizer  # live references stay valid
    assert client.optimizer.param_groups[0]["params"][0] is next(client.model.parameters())
    assert state_equal(named_tensors(client.model), named_tensors(shipped.model))
    assert torch.equal(client.generator.get_state(), shipped.generator.get_state())
    assert state_equal(client.control_delta, shipped.control_delta)
    # The update is the trained shared tensors and the control delta; gradients stay behind unless asked.
    assert update.client_id == 0 and update.num_samples == client.train_samples and update.gradients == {}
    assert state_equal(update.tensors, named_tensors(client.model))
    assert state_equal(update.extras["control_delta"], client.control_delta)
    assert client.train_data is not None  # the server's copy keeps its data
    assert train_detached(copy.deepcopy(shipped), keep_gradients=True)[1].gradients


class TrainedElsewhere(SequentialExecutor):
    """Trains a copy of each client, as a Ray worker does, and brings back only its state and its update
    (evaluation in this process, as there)."""

    def train(self, clients):
        results = []
        for client in clients:
            copied = copy.deepcopy(without_data(client))
            copied.train_data, copied.test_data = client.train_data, client.test_data
            results.append(train_detached(copied, keep_gradients=True))
        for client, (state, _) in zip(clients, results):
            client.set_state(state)
        return [update for _, update in results]


ELSEWHERE = [name for name in valid_names() if not name.endswith("+LAG")] + ["FedRep+LAG", "FedAS+LAG"]


@pytest.mark.parametrize("name", ELSEWHERE)
def test_every_algorithm_trained_elsewhere_equals_sequential(name, data_dir, tmp_path, monkeypatch):
    """The contract every executor relies on: a client's declared state and its update carry everything
    the server reads after training (aggregation, per-round records, evaluation after training)."""
    flags = ("-algo", name, "-nc", "4", "-jr", "0.5", "-gr", "1", "--eval_after_training", *method_flags(name))
    sequential = server_for(data_dir, tmp_path / "sequential", *flags)
    train(sequential)
    monkeypatch.setattr(app.run, "make_executor", lambda server, config: TrainedElsewhere())
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
def test_ray_with_two_workers_equals_sequential(algorithm, ray_session, data_dir, tmp_path):
    """Across processes: FedLAG (the mixin's scoring on updates that arrive as copies) and SCAFFOLD (an
    upload with extras). That each algorithm's state and update carry what the server reads is checked for
    every algorithm, in one process, by the test above."""
    arrays = {}
    for executor in ("sequential", "ray"):
        server = server_for(data_dir, tmp_path / executor, "-algo", algorithm, "-m", "CNN", "-jr", "0.5",
                            "-gr", "3", "--executor", executor, "--workers", "2")
        train(server)
        arrays[executor] = read_results(results_file(server))[0]
    assert set(arrays["ray"]) == set(arrays["sequential"])
    for name in set(arrays["ray"]) - TIMING:
        assert np.array_equal(arrays["ray"][name], arrays["sequential"][name]), name
