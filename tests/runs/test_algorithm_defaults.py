"""Every algorithm runs on its own defaults: a shared hyper-parameter flag left out takes the algorithm's
paper value where PFLlib's would refuse or switch the method off, is recorded in the .h5 and listed in
--help; a flag given keeps PFLlib's meaning and its checks."""
import dataclasses

import numpy as np
import pytest

import main
from app.build import hyperparameters, prepare
from app.options import build_parser, parse_args
from flcore.algorithm_flags import SOURCE, AlgorithmFlags
from flcore.registry import ALGORITHMS, valid_names
from helpers import TEST_THREADS, cli
from utils.errors import ConfigError
from utils.result_utils import read_results, result_path

# The weight that makes each method itself, and PFLlib's shared default that set it to nothing (or refused it).
SWITCHED_ON = {"Ditto": "pull_weight", "FedProx": "prox_weight", "MOON": "contrastive_weight",
               "FedNTD": "distillation_weight", "FedDBE": "mean_weight", "pFedMe": "server_mixing",
               "PerAvg": "meta_step_size", "FedPHP": "inheritance_ceiling", "FedCAC": "threshold_rounds",
               "APPLE": "relationship_learning_rate"}


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_algorithm_runs_a_round_with_no_hyperparameter_flag(name, data_dir, tmp_path, capsys):
    """As a user types it: ``-algo X`` and nothing about X (the small data and one round aside)."""
    flags = ["-algo", name, "-data", "Toy", "-nc", "6", "-gr", "0", "-dev", "cpu",
             "--data_dir", str(data_dir), "--results_dir", str(tmp_path)]
    assert main.main(flags) == 0, capsys.readouterr().err
    assert "warning" not in capsys.readouterr().err
    arrays, attrs = read_results(result_path(tmp_path, "Toy", name, "test", 0))
    assert attrs["complete"] and np.isfinite(arrays["rs_test_acc"]).all()
    config = parse_args(flags)
    own = ALGORITHMS[name].hyperparameters.flag_defaults()
    assert {flag: attrs["config"][flag] for flag in own} == own  # the .h5 records what the run took
    taken = hyperparameters(config)
    assert taken.problems() == []
    if name in SWITCHED_ON:
        assert getattr(taken, SWITCHED_ON[name]) > 0


def test_an_algorithms_own_default_replaces_only_the_flags_left_out():
    ditto = parse_args(["-algo", "Ditto+LAG"]).algorithm_flags
    assert ditto.mu == 1.0 and ditto.plocal_epochs == 1  # its own pull; PFLlib's personal epochs
    assert parse_args(["-algo", "Ditto", "-mu", "0"]).algorithm_flags.mu == 0.0  # given: PFLlib's meaning
    assert parse_args(["-algo", "FedAvg"]).algorithm_flags == AlgorithmFlags()  # reads nothing: PFLlib's values
    pfedme = parse_args(["-algo", "pFedMe", "-lam", "2"]).algorithm_flags
    assert (pfedme.beta, pfedme.lamda, pfedme.K, pfedme.p_learning_rate) == (1.0, 2.0, 5, 0.09)
    # Another algorithm's default for the same flag does not leak in: FedProx's -mu is not Ditto's.
    assert parse_args(["-algo", "FedProx"]).algorithm_flags.mu == 0.01
    assert parse_args(["-algo", "Nothing-like-it"]).algorithm_flags == AlgorithmFlags()


def test_a_value_given_is_still_checked_and_warned_about(data_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"-bt/--beta \(pFedMe's server step.*must be > 0, got 0.0"):
        prepare(parse_args(cli(data_dir, tmp_path, "-algo", "pFedMe", "-bt", "0")))
    with pytest.raises(ConfigError, match=r"-lam/--lamda \(FedPHP's MMD weight.*must be in \[0, 1\), got 1.0"):
        prepare(parse_args(cli(data_dir, tmp_path, "-algo", "FedPHP", "-lam", "1")))
    flags = ["-algo", "Ditto", "-data", "Toy", "-nc", "6", "-gr", "0", "--data_dir", str(data_dir),
             "--results_dir", str(tmp_path), "-mu", "0"]
    warnings = main.setup_problems(parse_args(flags))[1]
    assert any("-mu 0 with Ditto" in w and "Local training" in w for w in warnings)


def test_every_algorithm_reads_each_shared_flag_at_most_once():
    """A flag left out is filled from the one field that reads it (two would compete for its default)."""
    for name, spec in ALGORITHMS.items():
        sources = [f.metadata[SOURCE] for f in dataclasses.fields(spec.hyperparameters)]
        assert len(sources) == len(set(sources)), name


def test_help_lists_each_algorithms_own_default_beside_the_shared_flag():
    helps = {a.option_strings[0]: " ".join(a.help.split()) for a in build_parser()._actions if a.option_strings}
    assert helps["-mu"].startswith("proximal or contrastive weight")
    assert "(default: 0.0, or the algorithm's own: GPFL 0.1, FedProx 0.01, MOON 1, Ditto 1, FedPHP 0.9" in helps["-mu"]
    assert helps["-dlr"].endswith("(default: 0.0, or the algorithm's own: APPLE 0.001)")
    assert "pFedMe 1, PerAvg 0.001" in helps["-bt"]
    assert helps["-M"].endswith("(default: 5)")  # FedFomo takes PFLlib's


def test_the_run_record_of_a_flag_left_out_is_the_algorithms_value_and_resumes_alike():
    """What resume and the batch runner compare: a command without -mu for Ditto stands for -mu 1, so a
    run made with PFLlib's -mu 0 is another run."""
    from app.options import flag_defaults
    from utils.checkpoint import config_differences
    before = parse_args(["-algo", "Ditto", "-mu", "0"]).flags()
    now = parse_args(["-algo", "Ditto"]).flags()
    assert config_differences(before, now, flag_defaults()) == ["--mu: 0.0 in the checkpoint, 1.0 now"]
    assert flag_defaults()["mu"] == 0.0  # a record without the flag stands for PFLlib's value, as before


def test_a_finished_run_made_with_pfllibs_value_is_stale_for_a_command_leaving_the_flag_out(data_dir, tmp_path):
    from app.run_status import run_status
    flags = ["-algo", "Ditto", "-data", "Toy", "-nc", "6", "-gr", "0", "-dev", "cpu", "--threads", str(TEST_THREADS),
             "--data_dir", str(data_dir), "--results_dir", str(tmp_path)]
    assert main.main([*flags, "-mu", "0"]) == 0
    path = result_path(tmp_path, "Toy", "Ditto", "test", 0)
    assert run_status(path, [*flags, "-mu", "0"]) == "complete"
    assert run_status(path, flags) == "stale"


def test_x_plus_lag_takes_the_defaults_of_x():
    """X+LAG takes X's defaults (checked through the registry's base name)."""
    for name in valid_names():
        base = name.removesuffix("+LAG")
        assert parse_args(["-algo", name]).algorithm_flags == parse_args(["-algo", base]).algorithm_flags
