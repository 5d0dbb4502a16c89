"""FedPer: the base is averaged and broadcast, the head stays with each client."""
import copy

import numpy as np
import torch

from flcore.aggregation import named_tensors
from utils.result_utils import read_results
from helpers import assert_lag_composes, in_use, perturb_all_clients, play_round, server_for, state_equal, uploads_are, train, results_file


def hand_average(server, part):
    """sum_i n_i / sum(n) * part(client_i) over the uploading clients, written out."""
    by_id = {c.id: c for c in server.clients}
    uploads = [by_id[i] for i in server.uploader_ids()]
    total = sum(c.train_samples for c in uploads)
    return {name: sum(dict(part(c).named_parameters())[name].detach() * (c.train_samples / total) for c in uploads)
            for name, _ in part(uploads[0]).named_parameters()}


def test_base_is_averaged_and_every_head_stays_personal(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedPer", "-jr", "0.5")
    initial_head = copy.deepcopy(named_tensors(server.global_model.head))
    play_round(server)
    by_id = {c.id: c for c in server.clients}
    assert uploads_are(server, lambda c: in_use(c).model.base)
    for name, expected in hand_average(server, lambda c: in_use(c).model.base).items():
        assert torch.allclose(dict(server.global_model.base.named_parameters())[name], expected, atol=1e-6), name
    assert state_equal(named_tensors(server.global_model.head), initial_head)
    trained = [by_id[i] for i in server.uploader_ids()]
    assert not torch.equal(trained[0].module_tensors()["head.weight"], trained[1].module_tensors()["head.weight"])

    perturb_all_clients(server)
    heads = {c.id: copy.deepcopy(named_tensors(c.model.head)) for c in server.clients}
    server.send_models()
    for client in server.clients:
        assert state_equal(named_tensors(client.model.base), named_tensors(server.global_model.base))
        assert state_equal(named_tensors(client.model.head), heads[client.id]), f"client {client.id} lost its head"


def test_fedper_lag_personalises_base_tensors_only(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedPer+LAG", "-m", "CNN", "-jr", "0.5", "--lag_top_k", "4")  # + its head
    personal = assert_lag_composes(server, k=2)
    assert all(name.startswith("base.") for name in personal)


def test_end_to_end_run_records_finite_results(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedPer", "-gr", "1")
    train(server)
    arrays, _ = read_results(results_file(server))
    assert arrays["rs_test_acc"].shape == (2,) and np.all((arrays["rs_test_acc"] >= 0) & (arrays["rs_test_acc"] <= 1))
    assert np.all(np.isfinite(arrays["rs_train_loss"]))
    assert arrays["rs_test_acc"][-1] > arrays["rs_test_acc"][0]  # separable toy data: one round must help
