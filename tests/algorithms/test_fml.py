"""FML: the mutual-learning losses and who is moved by which, which model each series reports, what travels,
the paper's defaults, a newcomer, X+LAG."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from flcore.aggregation import named_tensors
from utils.errors import ConfigError
from utils.result_utils import read_results
from helpers import (in_use, assert_lag_composes, play_round, results_file, server_for, state_equal, train, uploads_are)
from mutual_checks import (assert_newcomer_gets_the_global_shared_model_and_a_fresh_private_one,
                           assert_one_backward_gives_each_model_its_own_loss, hand_kl, snapshot)
from personal_checks import accuracy_of, wiggle_, zero_

ALPHA, BETA = 0.3, 0.8


def test_each_model_descends_its_own_weighted_ce_plus_kl_towards_the_other(data_dir, tmp_path):
    client = server_for(data_dir, tmp_path, "-algo", "FML", "-al", str(ALPHA), "-bt", str(BETA)).clients[0]
    in_use(client)
    wiggle_(client.private_model, scale=0.3)  # the two models disagree, so both divergences are non-zero
    x, y = client.train_data.x[:8], client.train_data.y[:8]
    with torch.no_grad():
        local_logits, meme_logits = client.private_model(x), client.model(x)
    assert float(hand_kl(meme_logits, local_logits)) > 1e-3

    def local_loss(local):
        return ALPHA * F.cross_entropy(local(x), y) + (1 - ALPHA) * hand_kl(meme_logits, local(x))

    def meme_loss(meme):
        return BETA * F.cross_entropy(meme(x), y) + (1 - BETA) * hand_kl(local_logits, meme(x))

    assert_one_backward_gives_each_model_its_own_loss(client, x, y, local_loss, meme_loss)


def test_left_out_alpha_and_beta_take_the_papers_half_and_out_of_range_ones_are_refused(data_dir, tmp_path):
    client = server_for(data_dir, tmp_path, "-algo", "FML").clients[0]
    assert (client.alpha, client.beta) == (0.5, 0.5)  # PFLlib's -al 1 -bt 0 would leave the local model alone
    with pytest.raises(ConfigError, match=r"-al/--alpha \(FML's weight .*must be in \[0, 1\]"):
        server_for(data_dir, tmp_path, "-algo", "FML", "-al", "1.5")


def test_only_the_meme_model_travels_and_the_broadcast_never_touches_the_local_model(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FML", "-jr", "0.5")
    play_round(server)
    assert uploads_are(server, lambda client: client.model)
    for client in server.clients:
        wiggle_(in_use(client).model)
    before = {c.id: snapshot(c.private_model) for c in server.clients}
    server.send_models()
    for client in server.clients:
        assert state_equal(named_tensors(client.private_model), before[client.id])
        assert state_equal(named_tensors(client.model), named_tensors(server.global_model))


def test_rs_test_acc_reports_the_local_models_and_rs_global_the_meme_model(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FML")
    play_round(server)
    for client in server.clients:
        zero_(in_use(client).private_model)  # predicts class 0 everywhere: clearly not the meme model
    server.send_models()
    server.evaluate()
    history = server.history
    assert history["rs_test_acc"][-1] == pytest.approx(accuracy_of(server.clients, lambda c: c.private_model))
    assert history["rs_global_test_acc"][-1] == pytest.approx(accuracy_of(server.clients, lambda c: c.model))
    assert history["rs_test_acc"][-1] != history["rs_global_test_acc"][-1]


def test_two_rounds_train_both_models_and_record_both_accuracies(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FML", "-gr", "1")
    train(server)
    arrays, _ = read_results(results_file(server))
    for prefix in ("rs", "rs_global"):
        assert len(arrays[f"{prefix}_test_acc"]) == 2 and np.isfinite(arrays[f"{prefix}_train_loss"]).all()
    assert arrays["rs_train_loss"][1] < arrays["rs_train_loss"][0]  # the local models learned


def test_a_newcomer_gets_the_global_meme_model_and_a_fresh_local_model(data_dir, tmp_path):
    assert_newcomer_gets_the_global_shared_model_and_a_fresh_private_one(data_dir, tmp_path, "FML")


def test_fml_plus_lag_personalises_meme_tensors_and_leaves_the_local_model_alone(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-algo", "FML+LAG", "--lag_top_k", "2")
    assert_lag_composes(server, k=2, private=lambda c: named_tensors(c.private_model))
