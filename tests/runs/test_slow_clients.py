"""PFLlib's slow clients and time-based selection (-tsr, -ssr, -ts, -tth) on simulated time, and its
-fd, -sfn and -itk: parsed, recorded, honoured or said to change nothing."""
import math

import numpy as np
import pytest
import torch

import main
from app.options import parse_args, setup_notes, unused_flag_warnings
from flcore.aggregation import named_tensors, weighted_average
from flcore.client_time import SimulatedTime, slow_clients
from flcore.trainmodel.models import build_model
from utils.result_utils import read_results
from helpers import in_use, results_file, server_for, train

SLOW = ("-tsr", "0.5")


@pytest.mark.parametrize("short", [True, False])
def test_the_seven_flags_parse_and_land_in_the_config(short):
    names = (["-tsr", "-ssr", "-ts", "-tth", "-fd", "-sfn", "-itk"] if short else
             ["--train_slow_rate", "--send_slow_rate", "--time_select", "--time_threthold", "--feature_dim",
              "--save_folder_name", "--itk"])
    values = ["0.25", "0.5", "true", "2.5", "64", "saved", "7"]
    config = parse_args([word for pair in zip(names, values) for word in pair])
    assert (config.train_slow_rate, config.send_slow_rate, config.time_select, config.time_threthold) == (
        0.25, 0.5, True, 2.5)
    assert (config.feature_dim, config.save_folder_name, config.algorithm_flags.itk) == (64, "saved", 7)
    recorded = config.flags()
    assert (recorded["time_threthold"], recorded["itk"], recorded["feature_dim"]) == (2.5, 7, 64)


def test_pfllib_defaults_and_the_corrected_spelling():
    config = parse_args([])
    assert (config.train_slow_rate, config.send_slow_rate, config.time_select, config.time_threthold) == (
        0.0, 0.0, False, 10000.0)
    assert (config.feature_dim, config.save_folder_name, config.algorithm_flags.itk) == (512, "items", 4000)
    assert parse_args(["--time_threshold", "3"]).time_threthold == 3.0
    assert parse_args(["-ts"]).time_select is True and parse_args(["-ts", "false"]).time_select is False


@pytest.mark.parametrize("argv, message", [
    (["-tsr", "1.5"], "-tsr/--train_slow_rate must be in [0, 1], got 1.5"),
    (["-tsr", "-0.1"], "-tsr/--train_slow_rate must be in [0, 1], got -0.1"),
    (["-ssr", "2"], "-ssr/--send_slow_rate must be in [0, 1], got 2.0"),
    (["-tth", "0"], "-tth/--time_threthold/--time_threshold must be > 0, got 0.0"),
    (["-tth", "-5"], "-tth/--time_threthold/--time_threshold must be > 0, got -5.0"),
    (["-fd", "0"], "-fd/--feature_dim must be >= 1, got 0"),
])
def test_bad_values_are_one_line_naming_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        main.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"error: {message}" in err


def test_slow_clients_are_int_rate_times_n_distinct_and_drawn_from_the_seed():
    for rate, count in ((0.0, 0), (0.25, 5), (0.5, 10), (0.33, 6), (1.0, 20)):
        mask = slow_clients(3, 20, rate, 0)
        assert mask.sum() == count  # int(0.33 * 20) = 6 distinct clients
    assert np.array_equal(slow_clients(3, 20, 0.5, 0), slow_clients(3, 20, 0.5, 0))
    assert not np.array_equal(slow_clients(3, 20, 0.5, 0), slow_clients(4, 20, 0.5, 0))
    assert not np.array_equal(slow_clients(3, 20, 0.5, 0), slow_clients(3, 20, 0.5, 1))  # training vs sending


def test_a_clients_simulated_time_is_the_documented_formula():
    config = parse_args(["-tsr", "0.5", "-ssr", "0.5", "-ls", "3", "-lbs", "8", "-nc", "4", "--seed", "11"])
    sim = SimulatedTime(config, 4)
    fast_train = int(np.flatnonzero(sim.train_slow == 0)[0])
    slow_train = int(np.flatnonzero(sim.train_slow == 1)[0])
    # 3 epochs of ceil(21 / 8) = 3 minibatches of 0.01 s: 0.09 s, whatever the round.
    assert sim.train_time(fast_train, 0, 21) == pytest.approx(0.09)
    assert sim.train_time(fast_train, 5, 21) == pytest.approx(0.09)
    # A slow client adds 0.1 s * u per minibatch, u uniform in [0, 1) from its own stream: 9 * (0.01 + 0.1 u).
    u = np.random.default_rng([11, 7302, 0, slow_train, 2]).random()
    assert sim.train_time(slow_train, 2, 21) == pytest.approx(9 * (0.01 + 0.1 * u))
    assert 0.09 <= sim.train_time(slow_train, 2, 21) < 0.99
    fast_send = int(np.flatnonzero(sim.send_slow == 0)[0])
    slow_send = int(np.flatnonzero(sim.send_slow == 1)[0])
    v = np.random.default_rng([11, 7302, 1, slow_send, 4]).random()
    assert sim.send_time(fast_send, 4) == pytest.approx(0.01)
    assert sim.send_time(slow_send, 4) == pytest.approx(0.01 + 1.0 * v)
    # A client's time: mean training time over the rounds it trained plus mean sending time over all rounds.
    times = SimulatedTime.client_times([np.array([0.2, np.nan]), np.array([0.4, 0.3])],
                                       [np.array([0.01, 0.5]), np.array([0.03, 0.7])])
    assert times == pytest.approx([0.3 + 0.02, 0.3 + 0.6])


def test_the_same_seed_gives_the_same_time_series(data_dir, tmp_path):
    series = []
    for name in ("a", "b"):
        server = server_for(data_dir, tmp_path / name, "-tsr", "0.5", "-ssr", "0.34", "-jr", "0.5")
        train(server)
        arrays, _ = read_results(results_file(server))
        series.append({k: arrays[k] for k in ("rs_sim_train_time", "rs_sim_send_time", "rs_sim_round_time",
                                              "rs_time_left_out")})
    assert series[0]["rs_sim_train_time"].shape == (3, 6)  # rounds 0..2, one value per client
    assert np.isnan(series[0]["rs_sim_train_time"]).sum() == 9  # 3 of 6 clients trained per round
    assert not series[0]["rs_time_left_out"].any()  # without -ts nobody is left out
    for name, values in series[0].items():
        assert np.array_equal(values, series[1][name], equal_nan=True), name


def _round_zero_times(data_dir, tmp_path):
    """Each client's simulated time in round 0 (every client trains, -jr 1), by the documented formula."""
    server = server_for(data_dir, tmp_path / "probe", *SLOW)
    sim = server.sim_time
    samples = {c.id: c.train_samples for c in server.clients}
    times = {}
    for cid, n in samples.items():
        per_batch = 0.01 + (0.1 * np.random.default_rng([0, 7302, 0, cid, 0]).random() if sim.train_slow[cid] else 0)
        times[cid] = math.ceil(n / 10) * per_batch + 0.01
    fast = [t for cid, t in times.items() if not sim.train_slow[cid]]
    slow = [t for cid, t in times.items() if sim.train_slow[cid]]
    assert max(fast) < min(slow)  # with --seed 0 on this data the slow clients are slower than every fast one
    return times, (max(fast) + min(slow)) / 2, {cid for cid in times if sim.train_slow[cid]}


def _play_round_zero(server):
    server.current_round = 0
    server.selected_clients = server.select_clients()
    server.send_models()
    server.train_clients(server.selected_clients)
    server.receive_models()


@pytest.mark.parametrize("algorithm", ["FedAvg", "FedLAG"])
def test_time_select_leaves_slow_clients_out_before_anything_reads_the_uploads(algorithm, data_dir, tmp_path):
    times, threshold, slow = _round_zero_times(data_dir, tmp_path)
    server = server_for(data_dir, tmp_path / "ts", "-algo", algorithm, *SLOW, "-ts", "true", "-tth", str(threshold))
    _play_round_zero(server)
    kept = sorted(set(times) - slow)
    assert len(slow) == 3 and sorted(server.uploader_ids()) == kept
    assert server.history["rs_time_left_out"][-1].tolist() == [int(cid in slow) for cid in range(6)]
    assert server.history["rs_sim_round_time"][-1] == pytest.approx(max(times[cid] for cid in kept))
    updates = [server.trained_updates[cid] for cid in kept]
    expected = weighted_average([u.tensors for u in updates], [u.num_samples / sum(v.num_samples for v in updates)
                                                               for u in updates])
    if algorithm == "FedLAG":
        # The layer-conflict scoring saw the kept clients only: a row per selected client, zero where left out.
        assert set(server.lag_updates.scored) == set(kept)
        for row, client in enumerate(server.selected_clients):
            assert server.lag_updates.matrix[row].any() == (client.id in kept)
        assert server.lag_selector.history["scores"][-1] is not None
        return
    server.aggregate_parameters()
    got = named_tensors(server.global_shared_module())
    for name, value in expected.items():
        assert torch.allclose(got[name], value, atol=1e-6), name


def test_without_the_flags_nothing_changes_and_marking_alone_changes_no_result(data_dir, tmp_path):
    runs = {}
    for name, flags in (("plain", ()), ("zero", ("-tsr", "0", "-ssr", "0")),
                        ("marked", ("-tsr", "0.5", "-ssr", "0.5"))):
        server = server_for(data_dir, tmp_path / name, "-jr", "0.5", *flags)
        train(server)
        runs[name], _ = read_results(results_file(server))
    timed = {"rs_round_time"}
    simulated = {"rs_sim_train_time", "rs_sim_send_time", "rs_sim_round_time", "rs_time_left_out"}
    assert set(runs["plain"]) == set(runs["zero"]) and not simulated & set(runs["plain"])
    assert set(runs["marked"]) == set(runs["plain"]) | simulated
    for name in set(runs["plain"]) - timed:
        assert runs["plain"][name].tobytes() == runs["zero"][name].tobytes(), name
        assert runs["plain"][name].tobytes() == runs["marked"][name].tobytes(), name


def test_feature_dim_sets_the_text_models_width_and_is_a_note_elsewhere():
    lstm = build_model("LSTM", (20,), 4, vocab_size=30, feature_dim=64)
    assert lstm.embedding.weight.shape == (30, 64)
    assert build_model("Transformer", (20,), 4, vocab_size=30, feature_dim=32).fc.in_features == 32
    assert build_model("fastText", (20,), 4, vocab_size=30).embedding.weight.shape == (30, 512)  # PFLlib's 512
    argv = ["-fd", "64", "-m", "CNN"]
    assert any(note.startswith("-fd/--feature_dim 64 changes nothing for -m CNN") for note in
               setup_notes(parse_args(argv), argv))
    argv = ["-fd", "64", "-m", "LSTM"]
    assert not any("feature_dim" in note for note in setup_notes(parse_args(argv), argv))


def test_save_folder_name_and_itk_say_they_change_nothing():
    argv = ["-sfn", "elsewhere"]
    assert any(note.startswith("-sfn/--save_folder_name elsewhere changes nothing") for note in
               setup_notes(parse_args(argv), argv))
    argv = ["-algo", "FedMTL", "-itk", "10"]
    config = parse_args(argv)
    assert any(n.startswith("-itk/--itk 10 is recorded and changes nothing") for n in setup_notes(config, argv))
    assert unused_flag_warnings(config, argv) == []  # FedMTL's own flag
    argv = ["-algo", "FedAvg", "-itk", "10"]
    assert [w for w in unused_flag_warnings(parse_args(argv), argv) if w.startswith("-itk/--itk is not read by FedAvg")]


def test_a_run_killed_and_resumed_simulates_the_same_times(data_dir, tmp_path):
    """The times are drawn per client and round and the averages read from the recorded series, so a resumed
    run leaves out and records what the uninterrupted one did."""
    from flcore.registry import resolve
    from helpers import server_of_class
    flags = ("-tsr", "0.5", "-ssr", "0.5", "-ts", "true", "-tth", "0.3", "-jr", "0.5", "-gr", "4",
             "--checkpoint_every", "1")
    reference = server_for(data_dir, tmp_path / "clean", *flags)
    train(reference)
    expected, _ = read_results(results_file(reference))
    assert expected["rs_time_left_out"].any() and not expected["rs_time_left_out"].all()

    class Killed(BaseException):
        """Stands for kill -9: nothing after the last checkpoint survives."""

    server_class, spec = resolve("FedAvg")

    class KilledInRoundThree(server_class):
        def end_round(self, rnd):
            if rnd == 3:
                raise Killed

    with pytest.raises(Killed):
        train(server_of_class(KilledInRoundThree, data_dir, tmp_path / "cut", *flags, head_split=spec.head_split))
    resumed = server_for(data_dir, tmp_path / "cut", *flags, "--resume")
    train(resumed)
    got, _ = read_results(results_file(resumed))
    assert set(got) == set(expected)
    for name in set(got) - {"rs_round_time"}:
        assert np.array_equal(got[name], expected[name], equal_nan=True), name
