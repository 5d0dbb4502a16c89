"""Executors: Ray workers give the sequential run's arrays bit for bit; state moves in place."""
import copy

import numpy as np
import pytest
import torch

from flcore.aggregation import named_tensors
from flcore.executors import merge_trained, without_data
from utils.result_utils import read_results
from conftest import server_for, state_equal

TIMING = {"rs_round_time"}


def test_merge_keeps_the_servers_objects_and_takes_the_trained_values(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "SCAFFOLD")
    client = server.clients[0]
    model, optimizer = client.model, client.optimizer
    shipped = copy.deepcopy(without_data(client))
    assert shipped.train_data is None and client.train_data is not None
    shipped.train_data, shipped.test_data = client.train_data, client.test_data
    shipped.train()
    merge_trained(client, without_data(shipped))
    assert client.model is model and client.optimizer is optimizer  # live references stay valid
    assert client.optimizer.param_groups[0]["params"][0] is next(client.model.parameters())
    assert state_equal(named_tensors(client.model), named_tensors(shipped.model))
    assert torch.equal(client.generator.get_state(), shipped.generator.get_state())
    assert all(p.grad is not None for p in client.model.parameters())
    assert client.train_data is not None  # the server's copy keeps its data


@pytest.mark.parametrize("algorithm", ["FedAvg", "FedLAG", "SCAFFOLD"])
def test_ray_with_two_workers_equals_sequential(algorithm, ray_session, data_dir, tmp_path):
    arrays = {}
    for executor in ("sequential", "ray"):
        server = server_for(data_dir, tmp_path / executor, "-algo", algorithm, "-m", "CNN", "-jr", "0.5",
                            "-gr", "3", "--executor", executor, "--workers", "2")
        server.train()
        arrays[executor] = read_results(server.results_file())[0]
    assert set(arrays["ray"]) == set(arrays["sequential"])
    for name in set(arrays["ray"]) - TIMING:
        assert np.array_equal(arrays["ray"][name], arrays["sequential"][name]), name
