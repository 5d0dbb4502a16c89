"""main.py's flags checked at the start: seeds a run can use, a negative memory budget named as such, what
--eval_clients above -nc means, flags the algorithm does not read, and the comparison commands after a
LAG run that carry only what the compared method reads."""
import pytest

import main
from app.options import flag_pieces, parse_args, setup_notes, unused_flag_warnings
from helpers import cli

LARGEST_SEED = 2**32 - 1


def one_line_refusal(argv, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        main.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("argv, message", [
    (["--seed", "1" + "0" * 23], f"--seed must be in [0, {LARGEST_SEED}] (the seeds NumPy's seeding takes), "
                                 f"got 1{'0' * 23}"),
    (["--seed", "-1"], f"--seed must be in [0, {LARGEST_SEED}]"),
    (["--seed", str(LARGEST_SEED + 1)], f"--seed must be in [0, {LARGEST_SEED}] (the seeds NumPy's seeding "
                                        f"takes), got {LARGEST_SEED + 1}"),
    # run 2 of -t 3 is seeded with --seed + 2
    (["--seed", str(LARGEST_SEED - 1), "-t", "3"],
     f"--seed {LARGEST_SEED - 1} with -t 3 seeds run 2 with {LARGEST_SEED + 1} (run i uses --seed + i), above "
     f"{LARGEST_SEED}, the largest seed NumPy's seeding takes; use --seed <= {LARGEST_SEED - 2}"),
])
def test_a_seed_no_run_can_use_is_one_line(argv, message, capsys):
    assert f"error: {message}" in one_line_refusal(argv, capsys)


def test_the_largest_seeds_are_accepted():
    assert parse_args(["--seed", str(LARGEST_SEED)]).seed == LARGEST_SEED
    assert parse_args(["--seed", str(LARGEST_SEED - 2), "-t", "3"]).for_run(2).seed == LARGEST_SEED


@pytest.mark.parametrize("argv", [["--state_memory", "-5G"], ["--state_memory=-5G"], ["--state_mem", " -5G"]])
def test_a_negative_memory_budget_is_named_with_the_accepted_forms(argv, capsys):
    err = one_line_refusal(argv, capsys)
    assert "argument --state_memory: " in err and "is a negative memory budget" in err
    assert "give a positive size, e.g. 512M, 2G or 1.5GiB, or auto" in err


def test_a_value_starting_with_a_dash_and_a_digit_is_a_value(capsys):
    assert "-lr/--local_learning_rate must be > 0, got -0.001" in one_line_refusal(["-lr", "-1e-3"], capsys)
    assert parse_args(["--state_memory", "5G"]).state_memory == "5G"


def test_eval_clients_above_the_client_count_is_a_note_not_an_error():
    assert setup_notes(parse_args(["-nc", "8", "--eval_clients", "1000"])) == [
        "--eval_clients 1000 is more than the 8 clients (-nc), so every client is evaluated, as with --eval_clients 0"]
    assert setup_notes(parse_args(["-nc", "8", "--eval_clients", "8"])) == []   # all 8, as asked
    assert setup_notes(parse_args(["-nc", "8", "--eval_clients", "3"])) == []


def warnings_of(*argv):
    return unused_flag_warnings(parse_args(list(argv)), list(argv))


def test_a_flag_the_algorithm_does_not_read_gets_a_warning_naming_both():
    assert warnings_of("-algo", "FedAvg", "--lag_share", "groups") == [
        "--lag_share is not read by FedAvg, so it changes nothing in this run (the --lag_* flags are read by FedLAG "
        "and X+LAG only)"]
    assert warnings_of("-algo", "FedAvg", "-mu", "0.1") == [
        "-mu/--mu is not read by FedAvg, so it changes nothing in this run (FedAvg reads none of the shared "
        "hyper-parameter flags)"]
    assert warnings_of("-algo", "FedProx+LAG", "-lam", "0.5") == [
        "-lam/--lamda is not read by FedProx+LAG, so it changes nothing in this run (of the shared hyper-parameter "
        "flags FedProx reads -mu)"]
    assert warnings_of("-algo", "FedLAG", "--lag_warmup", "3") == [
        "--lag_warmup is not read by FedLAG, so it changes nothing in this run (only --lag_schedule warmup reads "
        "it, and this run's is smoothed)"]
    assert warnings_of("--algorithm=FedAvg", "--lag_sh=groups")[0].startswith("--lag_share is not read by FedAvg")


def test_flags_an_algorithm_reads_and_defaults_get_no_warning():
    assert warnings_of("-algo", "FedAvg") == []              # every --lag_* and -mu default is in its record
    assert warnings_of("-algo", "FedProx", "-mu", "0.1", "-gr", "5") == []
    assert warnings_of("-algo", "FedLAG", "--lag_schedule", "warmup", "--lag_warmup", "3", "--lag_top_k", "2") == []
    assert warnings_of("-algo", "FedRep+LAG", "-pls", "2", "--lag_share", "groups") == []


def test_the_warning_is_printed_at_the_start_of_the_run(data_dir, tmp_path, capsys):
    assert main.main(cli(data_dir, tmp_path, "-gr", "0", "--lag_share", "groups", "--eval_clients", "99")) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == [
        "warning: --lag_granularity is not read by FedAvg, so it changes nothing in this run (the --lag_* flags "
        "are read by FedLAG and X+LAG only)",
        "warning: --lag_share is not read by FedAvg, so it changes nothing in this run (the --lag_* flags are "
        "read by FedLAG and X+LAG only)",
        "note: --eval_clients 99 is more than the 6 clients (-nc), so every client is evaluated, as with "
        "--eval_clients 0"]
    assert out[3].startswith("FedAvg | data Toy")


def test_a_command_is_cut_into_each_flag_with_its_value():
    argv = ["-algo", "FedLAG", "--lag_share=groups", "-t3", "-ab", "--lag_to", "2", "-ld", "no", "-lr", "-0.5",
            "--eval_after_training", "-go", "my run"]
    assert flag_pieces(argv) == [
        ("algorithm", ["-algo", "FedLAG"]), ("lag_share", ["--lag_share=groups"]), ("times", ["-t3"]),
        ("auto_break", ["-ab"]), ("lag_top_k", ["--lag_to", "2"]), ("learning_rate_decay", ["-ld", "no"]),
        ("local_learning_rate", ["-lr", "-0.5"]), ("eval_after_training", ["--eval_after_training"]),
        ("goal", ["-go", "my run"])]


def test_the_comparison_commands_carry_only_the_flags_the_compared_method_reads():
    argv = ["-algo", "FedLAG", "--lag_top_k", "2", "-gr", "5", "--lag_share=groups", "-mu", "0.1",
            "--lag_xi", "-0.2", "-go", "my run"]
    assert main.comparison_hint("FedLAG", argv) == (
        "compare with the base method: python system/main.py -algo FedAvg -gr 5 -go 'my run'\n"
        "and with each client alone: python system/main.py -algo Local -gr 5 -go 'my run'")
    argv = ["--algorithm=FedProx+LAG", "-mu", "0.1", "-lam", "0.5", "--lag_top_k=2", "-jr", "0.2"]
    assert main.comparison_hint("FedProx+LAG", argv) == (
        "compare with the base method: python system/main.py -algo FedProx -mu 0.1 -jr 0.2")


def test_leaving_the_round_count_out_is_said_at_the_start():
    from app.options import parse_args, setup_notes
    notes = setup_notes(parse_args(["-algo", "FedLAG", "-data", "MNIST"]), ["-algo", "FedLAG", "-data", "MNIST"])
    assert any(note.startswith("-gr left out: PFLlib's default, rounds 0..2000 (2001 rounds)") for note in notes)
    for given in (["-gr", "2000"], ["--global_rounds=5"], ["--global_r", "5"]):
        assert not any("-gr" in note for note in setup_notes(parse_args(given), given))
    assert setup_notes(parse_args([])) == []  # a config built without its command says nothing of it
