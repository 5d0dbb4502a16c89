"""FedKD: the truncated SVD by hand, the energy schedule, the adaptive mutual distillation and who is moved by
which term, the compressed upload and global update, the records, a newcomer, X+LAG."""
import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from flcore.aggregation import named_tensors
from flcore.exchange import ClientUpdate
from flcore.training.lowrank import kept_rank, low_rank_step, scheduled_energy, truncated
from utils.errors import ConfigError
from utils.result_utils import read_results
from helpers import assert_lag_composes, in_use, play_round, results_file, server_for, state_equal, train
from mutual_checks import (assert_gradients, assert_newcomer_gets_the_global_shared_model_and_a_fresh_private_one,
                           assert_one_backward_gives_each_model_its_own_loss, gradients_of, hand_kl)
from personal_checks import wiggle_

# A (3, 10) matrix of singular values 3, 2, 1 (energies 9, 4, 1 of 14): rank k costs 14 k numbers, 30 whole.
WIDE = torch.cat([torch.diag(torch.tensor([3.0, 2.0, 1.0])), torch.zeros(3, 7)], dim=1)


@pytest.mark.parametrize("energy, rank, numbers", [(0.5, 1, 14), (9 / 14, 1, 14), (0.9, 2, 28), (0.95, 3, 30),
                                                   (1.0, 3, 30)])
def test_the_fewest_singular_values_holding_the_share_of_energy_are_kept(energy, rank, numbers):
    assert kept_rank(torch.tensor([3.0, 2.0, 1.0]), energy) == rank
    approximation, sent = truncated(WIDE, energy)
    expected = WIDE.clone()
    expected[rank:] = 0  # rank 3 is the whole matrix: its 42 numbers of factors would exceed 30, so it goes whole
    assert torch.allclose(approximation, expected, atol=1e-6) and sent == numbers


def test_a_convolution_is_compressed_as_a_matrix_and_vectors_travel_whole():
    assert kept_rank(torch.zeros(3), 0.9) == 0
    kernel = torch.zeros(2, 1, 3, 3)
    kernel[0, 0, 0, 0], kernel[1, 0, 1, 1] = 4.0, 1.0  # rows of the (2, 9) matrix: energies 16 and 1
    approximation, numbers = truncated(kernel, 0.9)
    assert approximation.shape == kernel.shape and numbers == 1 * (2 + 9 + 1)
    assert torch.allclose(approximation, kernel * (kernel == 4.0), atol=1e-6)
    start = {"w": torch.zeros(2, 1, 3, 3), "b": torch.zeros(2)}
    end = {"w": kernel, "b": torch.tensor([0.5, -0.25])}
    rebuilt, sent = low_rank_step(start, end, 0.9)
    assert torch.equal(rebuilt["b"], end["b"]) and sent == 12 + 2
    assert torch.allclose(rebuilt["w"], approximation)


def test_the_energy_rises_linearly_from_t_start_to_t_end():
    assert scheduled_energy(0.95, 0.98, 0, 10) == 0.95
    assert scheduled_energy(0.95, 0.98, 5, 10) == pytest.approx(0.965)
    assert scheduled_energy(0.95, 0.98, 10, 10) == pytest.approx(0.98)
    assert scheduled_energy(0.95, 0.98, 0, 0) == 0.95


def test_each_model_descends_its_own_adaptive_distillation_loss(data_dir, tmp_path):
    client = in_use(server_for(data_dir, tmp_path, "-algo", "FedKD", "-mlr", "0.02").clients[0])
    wiggle_(client.private_model, scale=0.3)
    wiggle_(client.hidden_map, scale=0.1)
    x, y = client.train_data.x[:8], client.train_data.y[:8]
    with torch.no_grad():
        h_t, h_s = client.private_model.base(x), client.model.base(x)
        z_t, z_s = client.private_model.head(h_t), client.model.head(h_s)
        mapped = client.hidden_map(h_s)
        weight = 1 / (F.cross_entropy(z_t, y) + F.cross_entropy(z_s, y))

    def mentor_loss(mentor):
        features = mentor.base(x)
        logits = mentor.head(features)
        return F.cross_entropy(logits, y) + weight * (hand_kl(z_s, logits) + ((features - mapped) ** 2).mean())

    def mentee_loss(mentee, hidden_map=client.hidden_map):
        features = mentee.base(x)
        logits = mentee.head(features)
        return F.cross_entropy(logits, y) + weight * (hand_kl(z_t, logits) + ((hidden_map(features) - h_t) ** 2).mean())

    assert_one_backward_gives_each_model_its_own_loss(client, x, y, mentor_loss, mentee_loss)
    assert_gradients(client.hidden_map, gradients_of(client.hidden_map,
                                                     lambda hidden_map: mentee_loss(client.model, hidden_map)))
    # The mentor steps at -lr, the mentee and W_h at -mlr.
    groups = client.optimizer.param_groups
    assert [g["lr"] for g in groups] == [0.05, 0.02]
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in [*client.model.parameters(),
                                                                     *client.hidden_map.parameters()]}


def trained_client(data_dir, tmp_path, energy: str):
    """Client 0 of a FedKD run after one round of local training with T = ``energy``, and what it received."""
    server = server_for(data_dir, tmp_path / energy, "-algo", "FedKD", "-Ts", energy, "-Te", energy)
    server.selected_clients = server.select_clients()
    server.send_models()
    client = in_use(server.clients[0])
    received = copy.deepcopy(named_tensors(client.model))
    return server, client, received, client.train()


def test_the_upload_is_the_received_mentee_plus_the_compressed_update(data_dir, tmp_path):
    _, _, received, exact = trained_client(data_dir, tmp_path, "1.0")
    _, client, _, compressed = trained_client(data_dir, tmp_path, "0.6")
    assert compressed.extras["numbers_sent"] < exact.extras["numbers_sent"]
    assert exact.extras["numbers_sent"] <= sum(p.numel() for p in client.model.parameters())
    for name, tensor in compressed.tensors.items():
        update = exact.tensors[name] - received[name]  # the same training, uncompressed
        if update.dim() >= 2:
            expected, _ = truncated(update, 0.6)
            assert torch.allclose(tensor, received[name] + expected, atol=1e-5), name
            if min(update.shape) > 4:  # (the 4 x 100 head would cost more as factors: it travels whole)
                assert torch.linalg.matrix_rank(tensor - received[name]) < min(update.shape), name
        else:
            assert torch.equal(tensor, exact.tensors[name]), name  # vectors travel whole
    assert state_equal(named_tensors(client.model), compressed.tensors)  # the mentee keeps what it sent


def test_the_server_adds_the_compressed_unweighted_mean_of_the_updates(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedKD", "-jr", "0.5", "-Ts", "0.7", "-Te", "0.7")
    server.selected_clients = server.select_clients()
    server.send_models()
    server.train_clients(server.selected_clients)
    server.receive_models()
    before = copy.deepcopy(named_tensors(server.global_model))
    uploads = [copy.deepcopy(u.tensors) for u in server.uploads]
    assert len({u.num_samples for u in server.uploads}) > 1  # unequal clients: a weighted mean would differ
    server.aggregate_parameters()
    for name, value in named_tensors(server.global_model).items():
        mean = sum(u[name] for u in uploads) / len(uploads)
        expected = before[name] + truncated(mean - before[name], 0.7)[0] if mean.dim() >= 2 else mean
        assert torch.allclose(value, expected, atol=1e-5), name
    assert server.history["fedkd_energy"] == [0.7]
    assert 0 < server.history["fedkd_download_fraction"][0] < 1
    assert 0 < server.history["fedkd_upload_fraction"][0] < 1


def test_a_run_records_the_energy_schedule_and_both_fractions(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedKD", "-gr", "2")
    train(server)
    arrays, _ = read_results(results_file(server))
    assert np.allclose(arrays["fedkd_energy"], [0.95, 0.965, 0.98])
    for name in ("fedkd_upload_fraction", "fedkd_download_fraction"):
        assert arrays[name].shape == (3,) and ((arrays[name] > 0) & (arrays[name] <= 1)).all(), name
    assert len(arrays["rs_global_test_acc"]) == len(arrays["rs_test_acc"]) == 3


def test_a_count_of_numbers_sent_that_cannot_be_is_refused(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedKD")
    update = in_use(server.clients[0]).upload()
    assert server.extras_problem(update) is None
    for bad in (-1, 10**9, 2.5, True, None):
        forged = ClientUpdate(update.client_id, update.num_samples, update.tensors, extras={"numbers_sent": bad})
        assert "numbers sent" in server.extras_problem(forged)


def test_thresholds_outside_the_unit_interval_are_refused(data_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"-Te/--T_end .*must be in \(0, 1\]"):
        server_for(data_dir, tmp_path, "-algo", "FedKD", "-Te", "1.5")


def test_a_newcomer_gets_the_global_mentee_a_fresh_mentor_and_an_identity_map(data_dir, tmp_path):
    def identity_map(newcomer):
        weight = newcomer.hidden_map.weight
        assert torch.equal(weight, torch.eye(weight.shape[0]))
    assert_newcomer_gets_the_global_shared_model_and_a_fresh_private_one(data_dir, tmp_path, "FedKD", also=identity_map)


def test_fedkd_plus_lag_personalises_mentee_tensors_and_leaves_the_mentor_alone(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedKD+LAG", "--lag_top_k", "2")
    assert_lag_composes(server, k=2, private=lambda c: {**named_tensors(c.private_model),
                                                        **{f"map.{n}": t for n, t in named_tensors(c.hidden_map).items()}})


def test_two_rounds_train_the_mentors(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FedKD", "-gr", "1")
    play_round(server)
    train(server)
    arrays, _ = read_results(results_file(server))
    assert arrays["rs_train_loss"][-1] < arrays["rs_train_loss"][0]
