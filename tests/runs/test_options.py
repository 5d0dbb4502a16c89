"""Flag parsing: PFLlib names, booleans that mean what they say, clear refusals."""
import subprocess
import sys

import pytest

from dataclasses import fields

from helpers import REPO
from flcore.algorithm_flags import SOURCE, AlgorithmFlags
from flcore.hyperparameters import FedProxParams, PFedMeParams
from flcore.registry import ALGORITHMS
from app.options import build_parser, flag_defaults, parse_args


@pytest.mark.parametrize("text,expected", [("False", False), ("false", False), ("0", False), ("no", False),
                                           ("True", True), ("1", True), ("yes", True)])
def test_boolean_flags_parse_false_as_false(text, expected):
    # PFLlib's type=bool made "-ab False" true.
    assert parse_args(["-ab", text]).auto_break is expected
    assert parse_args(["--learning_rate_decay", text]).learning_rate_decay is expected


def test_bare_boolean_flag_means_true_and_absence_false():
    assert parse_args(["-rjr"]).random_join_ratio is True
    assert parse_args([]).random_join_ratio is False


def test_pfllib_short_and_long_names_and_defaults():
    args = parse_args(["-lbs", "16", "-lr", "0.01", "-gr", "5", "-ls", "2", "-jr", "0.5", "-nc", "40",
                       "-eg", "2", "-t", "3", "-pv", "1", "-go", "exp", "-did", "1", "-nnc", "2",
                       "-ften", "3", "-fs", "5", "-cdr", "0.1", "-tc", "7", "-ldg", "0.9", "-ncl", "10"])
    assert (args.batch_size, args.local_learning_rate, args.global_rounds, args.local_epochs) == (16, 0.01, 5, 2)
    assert (args.join_ratio, args.num_clients, args.eval_gap, args.times, args.prev) == (0.5, 40, 2, 3, 1)
    assert (args.goal, args.device_id, args.num_new_clients, args.fine_tuning_epoch_new) == ("exp", "1", 2, 3)
    assert (args.few_shot, args.client_drop_rate, args.top_cnt, args.learning_rate_decay_gamma) == (5, 0.1, 7, 0.9)
    defaults = parse_args([])
    assert (defaults.batch_size, defaults.local_learning_rate, defaults.global_rounds) == (10, 0.005, 2000)
    assert (defaults.algorithm, defaults.model, defaults.dataset, defaults.seed) == ("FedAvg", "CNN", "Digits", 0)


@pytest.mark.parametrize("argv,message", [
    (["-jr", "0"], "-jr/--join_ratio must be in (0, 1]"),
    (["-jr", "1.5"], "-jr/--join_ratio must be in (0, 1]"),
    (["-gr", "-1"], "-gr/--global_rounds must be >= 0"),
    (["--lag_xi", "0.5"], "--lag_xi must be in [-1, 0]"),
    (["-ab", "maybe"], "expected a boolean"),
    (["--report_last_k", "0"], "--report_last_k must be >= 1"),
])
def test_out_of_range_values_are_refused_with_the_accepted_range(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code != 0
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flag,value,listed", [("-algo", "FedAwg", "FedAvg"), ("-m", "CNNN", "ResNet9"),
                                               ("-dev", "tpu", "cpu, cuda")])
def test_unknown_names_list_the_valid_ones_and_exit_non_zero(flag, value, listed, data_dir, tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "system" / "main.py"), flag, value, "-data", "Toy",
                           "-nc", "6", "-gr", "0", "--data_dir", str(data_dir), "--results_dir", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert listed in proc.stderr and "Traceback" not in proc.stderr


def test_shared_hyperparameter_and_lag_flags_keep_their_names_and_defaults():
    """PFLlib's defaults, which a flag left out stands for in a record (its command line reads None there, for
    the chosen algorithm's own default to fill in)."""
    defaults = {a.option_strings[0]: flag_defaults()[a.dest] for a in build_parser()._actions if a.option_strings
                and a.dest != "help"}
    assert {flag: defaults[flag] for flag in ("-bt", "-lam", "-mu", "-K", "-lrp", "-M", "-alk", "-sg", "-al", "-pls",
                                             "-tau", "-fte", "-slr", "-et", "-s", "-p", "-mo", "-klw")} == {
        "-bt": 0.0, "-lam": 1.0, "-mu": 0.0, "-K": 5, "-lrp": 0.01, "-M": 5, "-alk": 1.0, "-sg": 1.0, "-al": 1.0,
        "-pls": 1, "-tau": 1.0, "-fte": 10, "-slr": 1.0, "-et": 1.0, "-s": 80, "-p": 2, "-mo": 0.1, "-klw": 0.0}
    assert {flag: value for flag, value in defaults.items() if flag.startswith("--lag_")} == {
        "--lag_top_k": 1, "--lag_xi": 0.0, "--lag_schedule": "smoothed", "--lag_warmup": None,
        "--lag_granularity": "module", "--lag_signal": "delta", "--lag_decay": 0.9, "--lag_margin": 2.0,
        "--lag_share": "own", "--lag_group_cosine": 0.1, "--lag_check_data": "held_out",
        "--lag_upload": "all", "--lag_sketch_dim": 64}


def test_the_run_record_holds_every_flag_in_command_line_order():
    config = parse_args(["-gr", "10", "-mu", "0.5"])
    dests = [a.dest for a in build_parser()._actions if a.option_strings and a.dest != "help"]
    assert list(config.flags()) == dests  # the keys of the .h5's config and of the checkpoints
    assert config.flags()["mu"] == 0.5 and config.lag.warmup == config.flags()["lag_warmup"] == 5  # min(gr // 2, 30)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_algorithm_reads_shared_flags_at_its_own_or_pfllibs_default(name):
    """A field without its own default reads PFLlib's; the flags of a run that leaves every one out give each
    field its default."""
    declared = ALGORITHMS[name].hyperparameters
    pfllib = declared.from_flags(AlgorithmFlags())
    own = declared.own_defaults()
    for f in fields(declared):
        assert getattr(pfllib, f.name) == getattr(AlgorithmFlags(), f.metadata[SOURCE]), f.name
        if f.metadata[SOURCE] not in own:
            assert f.default == getattr(AlgorithmFlags(), f.metadata[SOURCE]), f.name
    assert declared.from_flags(AlgorithmFlags.for_algorithm(declared, {})) == declared()


def test_an_algorithm_refuses_a_shared_flag_naming_it_with_its_own_meaning():
    flags = parse_args(["-mu", "-1", "-bt", "0"]).algorithm_flags  # fine for the algorithms that ignore them
    assert FedProxParams.from_flags(flags).problems() == [
        "-mu/--mu (FedProx's proximal weight) must be >= 0, got -1.0"]
    assert PFedMeParams.from_flags(flags).problems()[0].endswith(
        "must be > 0, got 0.0; the paper uses 1 or 2: try -bt 1")
