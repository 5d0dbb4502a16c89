"""-dlg, -dlgg and -bnpc, PFLlib's DLG privacy evaluation, in real runs: what they record, that training is
the same without them, what the attacker of a layer-personalising method sees, and the inputs refused."""
import csv

import numpy as np
import pytest

import main
from app.options import parse_args, setup_notes
from flcore.privacy.leakage import LeakageEvaluation
from helpers import results_file, server_for, train
from utils.result_utils import read_results
from utils.run_table import csv_path

# Embedded Digits, four clients; -fs 1 keeps one image of each label a client holds, so with -lbs 10 a client
# trains one step on all its images: the update is that batch's gradient, the case DLG was made for.
DIGITS = ("-data", "Digits", "-nc", "4", "-gr", "1", "-fs", "1")
DLG = ("-dlg", "-dlgg", "1", "-bnpc", "1")


def run(data_dir, folder, *flags):
    server = server_for(data_dir, folder, *DIGITS, *flags)
    train(server)
    return server, read_results(results_file(server))[0]


@pytest.mark.parametrize("short", [True, False])
def test_the_three_flags_parse_with_pfllibs_names_and_defaults(short):
    names = ["-dlg", "-dlgg", "-bnpc"] if short else ["--dlg_eval", "--dlg_gap", "--batch_num_per_client"]
    config = parse_args([names[0], "True", names[1], "5", names[2], "3"])
    assert (config.dlg_eval, config.dlg_gap, config.batch_num_per_client) == (True, 5, 3)
    assert parse_args([names[0]]).dlg_eval is True  # bare, as a switch
    defaults = parse_args([])
    assert (defaults.dlg_eval, defaults.dlg_gap, defaults.batch_num_per_client) == (False, 100, 2)  # PFLlib's
    assert {"dlg_eval", "dlg_gap", "batch_num_per_client"} <= set(defaults.flags())


def test_a_run_records_the_attack_per_round_and_trains_exactly_as_without_it(digits_groups_dir, tmp_path):
    _, plain = run(digits_groups_dir, tmp_path / "plain")
    server, attacked = run(digits_groups_dir, tmp_path / "dlg", *DLG)
    dlg = {"rs_dlg_round", "rs_dlg_psnr", "rs_dlg_ssim", "rs_dlg_batches", "rs_dlg_tensors", "rs_dlg_seen"}
    assert set(attacked) == set(plain) | dlg
    for name in set(plain) - {"rs_round_time"}:
        assert attacked[name].tobytes() == plain[name].tobytes(), name  # rs_test_acc bit for bit, and the rest
    assert attacked["rs_dlg_round"].tolist() == [0, 1]
    assert attacked["rs_dlg_batches"].tolist() == [4, 4]  # -bnpc 1: one batch of each of the 4 uploads
    assert attacked["rs_dlg_seen"].tolist() == [1.0, 1.0]  # FedAvg uploads every tensor, and was sent them all
    # One step on a handful of 8x8 images: the attacker rebuilds them well (PSNR on [0, 1] pixels).
    assert np.all(attacked["rs_dlg_psnr"] > 20) and np.all(attacked["rs_dlg_ssim"] > 0.5)
    assert server.leakage.starts == {}  # what the clients were sent is not kept beyond the round
    rows = list(csv.DictReader(line for line in csv_path(results_file(server)).open() if not line.startswith("#")))
    assert [float(r["rs_dlg_psnr"]) for r in rows] == attacked["rs_dlg_psnr"].tolist()  # the CSV has them too


def test_the_attacker_of_a_fedlag_upload_misses_the_layers_it_did_not_send(digits_groups_dir, tmp_path):
    """FedLAG's clients upload every layer (the scoring reads them all) but receive no personal layer: the
    attacker knows no start for those, so their update is left out of the match."""
    server, arrays = run(digits_groups_dir, tmp_path / "lag", "-algo", "FedLAG", *DLG)
    personal = server.personal_names()
    assert personal  # after round 0 the most conflicting layer is kept personal
    total = sum(1 for _ in server.global_model.parameters())
    assert arrays["rs_dlg_tensors"].tolist() == [total, total - len(personal)]  # round 0: none personal yet
    assert arrays["rs_dlg_seen"][0] == 1.0 and arrays["rs_dlg_seen"][1] < 1.0


def test_the_gap_follows_pfllibs_evaluation_convention():
    leakage = LeakageEvaluation(parse_args(["-dlg", "-dlgg", "3"]), active=True)
    assert [r for r in range(10) if leakage.due(r)] == [0, 3, 6, 9]  # r % dlgg == 0, round 0 included
    assert not any(LeakageEvaluation(parse_args(["-dlgg", "3"]), active=False).due(r) for r in range(10))


@pytest.mark.parametrize("argv, message", [
    (["-dlgg", "0"], "-dlgg/--dlg_gap must be >= 1, got 0"),
    (["-bnpc", "0"], "-bnpc/--batch_num_per_client must be >= 1, got 0"),
    (["-dlg", "-m", "LSTM", "-data", "AG_News"], "-dlg/--dlg_eval cannot attack -m LSTM: the model takes token ids"),
    (["-dlg", "-m", "HARCNN", "-data", "HAR"], "-dlg/--dlg_eval cannot attack -m HARCNN: DLG's reconstructions are "
                                               "measured as images"),
])
def test_what_dlg_cannot_use_is_refused_in_one_line_before_round_0(argv, message, capsys):
    try:
        status = main.main(argv)
    except SystemExit as stop:  # argparse's refusal of a value
        status = stop.code
    err = capsys.readouterr().err
    assert status == 2
    assert len(err.splitlines()) == 1 and "Traceback" not in err and f"error: {message}" in err, err


def test_methods_that_upload_no_parameters_say_so_and_record_nothing(digits_groups_dir, tmp_path):
    argv = ["-algo", "FedProto", "-dlg"]
    assert any(n.startswith("-dlg/--dlg_eval changes nothing for FedProto: its clients upload no model parameters")
               for n in setup_notes(parse_args(argv), argv))
    assert not setup_notes(parse_args(["-dlg"]), ["-dlg"])[1:]  # FedAvg: nothing to say but -gr's default
    argv = ["-dlgg", "5"]
    assert "-dlgg/--dlg_gap changes nothing without -dlg/--dlg_eval, whose attacks they schedule" in \
        setup_notes(parse_args(argv), argv)
    server = server_for(digits_groups_dir, tmp_path / "proto", *DIGITS, "-algo", "Local", *DLG)
    assert not server.leakage.active and not server.leakage_due()
