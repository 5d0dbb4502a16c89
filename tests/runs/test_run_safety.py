"""Runs that lose nothing: checkpoints keyed by configuration, results that survive an unwritable
folder, one live run per results name, resume that cannot get stuck, checkpoints that are checked
before they are trusted, and flag values refused before any work."""
import io
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
import torch

import main
from flcore.clients.clientbase import DivergenceError
from flcore.registry import ALGORITHMS, resolve
from utils.errors import RunError
from flcore.state import StateError
from test_checkpoint import kill_after_checkpoints
from utils.checkpoint import CheckpointError, config_differences, config_key, save_checkpoint
from app.options import flag_defaults, parse_args
from utils.result_utils import read_results, result_path
from utils.run_lock import lock_path
from helpers import cli, main_command, play_round, results_file, run_of, server_for, server_of_class, train

TIMING = {"rs_round_time"}


def run_main(argv, capsys):
    code = main.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def same_arrays(got: dict, expected: dict) -> None:
    assert set(got) == set(expected)
    for name in set(got) - TIMING:
        assert np.array_equal(got[name], expected[name]), name
    assert len(got["rs_round_time"]) == len(expected["rs_round_time"])


def folder_of(server):
    return run_of(server).checkpoint_folder()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ----- item 2: checkpoints belong to a configuration ------------------------------------------------

def test_checkpoint_key_ignores_execution_flags_only(data_dir, tmp_path):
    base, defaults = parse_args(cli(data_dir, tmp_path)).flags(), flag_defaults()
    # report_last_k only summarises the finished series: a resume may change it, like an execution flag.
    for flag, value in [("workers", 7), ("results_dir", "elsewhere"), ("resume", True), ("checkpoint_every", 3),
                        ("report_last_k", 3)]:
        assert config_key(dict(base, **{flag: value}), defaults) == config_key(base, defaults), flag
        # --resume accepts the change
        assert config_differences(dict(base, **{flag: value}), base, defaults) == [], flag
    for flag, value in [("global_rounds", 6), ("local_learning_rate", 0.01), ("seed", 1)]:
        assert config_key(dict(base, **{flag: value}), defaults) != config_key(base, defaults), flag


@pytest.mark.crossprocess
def test_another_run_with_the_same_name_keeps_a_killed_runs_checkpoints(data_dir, tmp_path, capsys):
    """kill -9 after round 2 of -gr 12, then a complete -gr 2 run under the same name, then --resume: the
    resume continues the killed run (and takes over the lock file it left behind) once --overwrite allows
    it to replace the -gr 2 run."""
    results = tmp_path / "r"
    flags = ("-gr", "12", "-jr", "0.5", "--checkpoint_every", "1", "-go", "ck")
    long_run = cli(data_dir, results, *flags)
    reference = server_for(data_dir, tmp_path / "clean", *flags)
    train(reference)
    killed = kill_after_checkpoints(main_command(*long_run), results / "checkpoints" / "Toy_FedAvg_ck_0")
    assert killed.returncode == -signal.SIGKILL
    assert lock_path(result_path(results, "Toy", "FedAvg", "ck", 0)).exists()  # left behind by kill -9

    code, _, err = run_main(cli(data_dir, results, "-gr", "2", "-jr", "0.5", "-go", "ck"), capsys)
    assert code == 0, err
    # Continuing would replace that complete -gr 2 run: refused until asked for.
    code, _, err = run_main(long_run + ["--resume"], capsys)
    assert code == 2 and "holds a complete run made with other flags (-gr 2 there, 12 here)" in err, err
    code, out, err = run_main(long_run + ["--resume", "--overwrite"], capsys)
    assert code == 0, err
    assert "resumed after round" in out and "starting from round 0" not in out
    got, attrs = read_results(result_path(results, "Toy", "FedAvg", "ck", 0))
    assert attrs["complete"]
    same_arrays(got, read_results(results_file(reference))[0])
    assert not (results / "checkpoints" / "Toy_FedAvg_ck_0").exists()
    assert not lock_path(result_path(results, "Toy", "FedAvg", "ck", 0)).exists()


def test_a_completed_run_removes_only_its_own_configurations_checkpoints(data_dir, tmp_path):
    crashed = server_for(data_dir, tmp_path, "-gr", "6", "--checkpoint_every", "1")
    play_round(crashed)
    run_of(crashed).save_checkpoint(0)
    other = server_for(data_dir, tmp_path, "-gr", "1", "--checkpoint_every", "1")
    train(other)
    assert folder_of(crashed) != folder_of(other)
    assert (folder_of(crashed) / "round_000000.pt").is_file() and not folder_of(other).exists()


def test_resume_from_a_checkpoint_of_other_flags_is_refused_with_the_differences(data_dir, tmp_path):
    run_of(server_for(data_dir, tmp_path, "-gr", "3", "--checkpoint_every", "1")).save_checkpoint(1)
    with pytest.raises(CheckpointError, match=r"other flags \(--global_rounds: 3 in the checkpoint, 4 now"):
        run_of(server_for(data_dir, tmp_path, "-gr", "4", "--checkpoint_every", "1")).resume()


def test_checkpoints_of_the_layout_before_keys_are_still_resumed(data_dir, tmp_path):
    original = server_for(data_dir, tmp_path, "-gr", "3", "--checkpoint_every", "1")
    play_round(original)
    path = run_of(original).save_checkpoint(0)
    legacy = path.parent.parent  # checkpoints/<name>/, where checkpoints used to lie
    for file in path.parent.iterdir():
        file.rename(legacy / file.name)
    path.parent.rmdir()
    resumed = server_for(data_dir, tmp_path, "-gr", "3", "--checkpoint_every", "1")
    assert "resumed after round 0" in run_of(resumed).resume()
    assert resumed.current_round == 1


# ----- item 3: results that cannot be written ---------------------------------------------------

def test_an_unwritable_results_dir_is_refused_before_any_data_is_read(tmp_path, capsys):
    (tmp_path / "plain_file").write_text("x")
    code, _, err = run_main(["-data", "NoSuchData", "-gr", "0", "-dev", "cpu", "--data_dir", str(tmp_path),
                             "--results_dir", str(tmp_path / "plain_file" / "sub")], capsys)
    assert code == 2
    assert "--results_dir" in one_error_line(err) and "cannot write there" in err  # not the missing dataset


def test_an_unwritable_checkpoint_folder_is_refused_before_round_0(data_dir, tmp_path, capsys):
    (tmp_path / "checkpoints").write_text("a file where the checkpoint folder goes")
    code, out, err = run_main(cli(data_dir, tmp_path, "--checkpoint_every", "1"), capsys)
    assert code == 2 and "--checkpoint_every: cannot write checkpoints" in one_error_line(err)
    assert "round  0" not in out and not result_path(tmp_path, "Toy", "FedAvg", "test", 0).exists()


def test_a_results_path_that_is_a_folder_is_refused_before_round_0(data_dir, tmp_path, capsys):
    result_path(tmp_path, "Toy", "FedAvg", "test", 0).mkdir(parents=True)
    code, out, err = run_main(cli(data_dir, tmp_path), capsys)
    assert code == 2 and "is a folder, where this run writes its results file" in one_error_line(err)
    assert "round  0" not in out


def test_results_that_cannot_be_written_at_the_end_go_to_a_fallback_file(data_dir, tmp_path, monkeypatch):
    results, spare = tmp_path / "results", tmp_path / "tmp"
    monkeypatch.setattr(tempfile, "tempdir", str(spare))  # the system temporary folder, for this test
    server_class, _ = resolve("FedAvg")

    class FolderLostDuringTheRun(server_class):
        def finish(self):
            shutil.rmtree(results)
            results.write_text("the results folder became a file")

    reference = server_for(data_dir, tmp_path / "clean")
    train(reference)
    server = server_of_class(FolderLostDuringTheRun, data_dir, results, head_split=False)
    with pytest.raises(RunError, match="the complete results were written to") as stop:
        train(server)
    fallback = spare / "pfl-results" / f"Toy_FedAvg_test_0-{os.getpid()}.h5"
    assert str(fallback) in str(stop.value) and "\n" not in str(stop.value)
    got, attrs = read_results(fallback)
    assert attrs["complete"]
    same_arrays(got, read_results(results_file(reference))[0])


# ----- item 4: -ab and a kill during finish() -------------------------------------------------------

def test_a_run_stopped_by_auto_break_and_killed_in_finish_resumes_without_an_extra_round(data_dir, tmp_path):
    flags = ("-algo", "FedBABU", "-gr", "12", "-ab", "-tc", "1", "-jr", "0.5", "-fte", "1",
             "--checkpoint_every", "1")
    server_class, spec = resolve("FedBABU")
    reference = server_for(data_dir, tmp_path / "clean", *flags)
    train(reference)
    expected, _ = read_results(results_file(reference))
    assert len(expected["rs_test_acc"]) < 13  # -ab did stop the run early

    class Killed(BaseException):
        """Stands for kill -9: nothing catches it, so nothing after the last checkpoint survives."""

    class KilledInFinish(server_class):
        def finish(self):
            raise Killed

    with pytest.raises(Killed):
        train(server_of_class(KilledInFinish, data_dir, tmp_path / "r", *flags, head_split=spec.head_split))
    resumed = server_for(data_dir, tmp_path / "r", *flags, "--resume")
    assert run_of(resumed).loop_done
    train(resumed)
    got, _ = read_results(results_file(resumed))
    same_arrays(got, expected)


# ----- item 5: resume never gets stuck --------------------------------------------------------------

@pytest.mark.parametrize("damage", ["no_checksum", "all_corrupt"])
def test_resume_without_a_usable_checkpoint_starts_from_round_0_and_says_so(damage, data_dir, tmp_path, capsys):
    flags = cli(data_dir, tmp_path, "--checkpoint_every", "1")
    server = server_for(data_dir, tmp_path, "--checkpoint_every", "1")
    for rnd in range(2 if damage == "all_corrupt" else 1):
        run_of(server).save_checkpoint(rnd)
    folder = folder_of(server)
    if damage == "no_checksum":
        (folder / "round_000000.sha256").unlink()
    else:
        for path in folder.glob("*.pt"):
            path.write_bytes(b"garbage")
    code, out, err = run_main(flags + ["--resume"], capsys)
    assert code == 0, err
    assert "no usable checkpoint" in out and "starting from round 0" in out
    _, attrs = read_results(result_path(tmp_path, "Toy", "FedAvg", "test", 0))
    assert attrs["complete"] and attrs["rounds_done"] == 3


# ----- item 7: one live run per results name -------------------------------------------------------

def test_a_second_live_run_with_the_same_name_is_refused(data_dir, tmp_path, capsys):
    flags = cli(data_dir, tmp_path, "-gr", "100000")
    lock = lock_path(result_path(tmp_path, "Toy", "FedAvg", "test", 0))
    holder = subprocess.Popen(main_command(*flags), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 60
        while not lock.exists() and holder.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        assert holder.poll() is None, holder.stderr.read().decode()
        code, _, err = run_main(flags, capsys)
        assert code == 2
        assert f"is being written by process {holder.pid}" in one_error_line(err)
        assert "another -go/--goal" in err
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()


def test_a_stale_lock_of_a_dead_process_is_taken_over(data_dir, tmp_path):
    lock = lock_path(result_path(tmp_path, "Toy", "FedAvg", "test", 0))
    lock.write_text(f"{dead_pid()}\n")
    server = server_for(data_dir, tmp_path)
    train(server)
    assert read_results(results_file(server))[1]["complete"] and not lock.exists()


# ----- item 11: damaged checkpoint files give one line naming the file -----------------------------

def test_a_checksum_file_that_is_not_text_is_named_and_the_previous_checkpoint_used(data_dir, tmp_path, capsys):
    server = server_for(data_dir, tmp_path, "-gr", "3", "--checkpoint_every", "1")
    play_round(server)
    run_of(server).save_checkpoint(0)
    run_of(server).save_checkpoint(1)
    (folder_of(server) / "round_000001.sha256").write_bytes(b"\xff\xfe\x00garbage")
    code, out, err = run_main(cli(data_dir, tmp_path, "-gr", "3", "--checkpoint_every", "1", "--resume"), capsys)
    assert code == 0 and "Traceback" not in err, err
    note = next(line for line in out.splitlines() if line.startswith("note:"))
    assert "round_000001.sha256 is not a checksum" in note and "resumed after round 0" in note


def test_a_checksummed_checkpoint_of_the_wrong_structure_is_named_and_skipped(data_dir, tmp_path, capsys):
    server = server_for(data_dir, tmp_path, "-gr", "3", "--checkpoint_every", "1")
    play_round(server)
    run_of(server).save_checkpoint(0)
    bad = torch.load(run_of(server).save_checkpoint(1), weights_only=True)
    tensors = bad["server"]["global_model"]["__module__"]
    name = next(iter(tensors))
    tensors[name] = torch.zeros(3, 3)
    save_checkpoint(folder_of(server), 1, bad)  # a valid checksum over a state of the wrong shape
    code, out, err = run_main(cli(data_dir, tmp_path, "-gr", "3", "--checkpoint_every", "1", "--resume"), capsys)
    assert code == 0 and "Traceback" not in err, err
    note = next(line for line in out.splitlines() if line.startswith("note:"))
    assert f"round_000001.pt: does not fit this run (server.global_model.{name}: shape (3, 3)" in note
    assert "resumed after round 0" in note


# ----- item 12: flag values refused or warned about before any work --------------------------------

@pytest.mark.parametrize("argv,message", [
    (["-lam", "nan"], "-lam/--lamda must be a finite number, got nan"),
    (["-bt", "inf"], "-bt/--beta must be a finite number, got inf"),
    (["--mu=-inf"], "-mu/--mu must be a finite number, got -inf"),
    (["-lrp", "nan"], "-lrp/--p_learning_rate must be a finite number"),
    (["-ld", "-ldg", "0"], "-ldg/--learning_rate_decay_gamma must be > 0 with -ld"),
    (["-ld", "-ldg", "-1"], "-ldg/--learning_rate_decay_gamma must be > 0 with -ld"),
    (["-ld", "-ldg", "nan"], "-ldg/--learning_rate_decay_gamma must be a finite number"),
])
def test_nan_and_meaningless_values_are_refused_at_parse_time(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        parse_args(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_a_value_refused_by_its_range_check_is_not_reported_twice(capsys):
    with pytest.raises(SystemExit):
        parse_args(["-lr", "inf"])
    assert capsys.readouterr().err.count("-lr/--local_learning_rate") == 1


@pytest.mark.parametrize("flags", [["-nc", "20", "-cdr", "0.99"], ["-nc", "20", "-cdr", "0.9", "-jr", "0.1"],
                                   ["-nc", "6", "-cdr", "0.7", "-jr", "0.5"]])
def test_a_drop_rate_that_drops_every_update_is_refused_before_the_data(flags, tmp_path, capsys):
    code, _, err = run_main(["-data", "NoSuchData", "-dev", "cpu", "--data_dir", str(tmp_path),
                             "--results_dir", str(tmp_path), *flags], capsys)
    assert code == 2 and "drops every update" in one_error_line(err) and "lower -cdr" in err


def test_zero_local_epochs_is_warned_about(data_dir, tmp_path, capsys):
    code, _, err = run_main(cli(data_dir, tmp_path, "-ls", "0", "-gr", "0"), capsys)
    assert code == 0 and "warning: -ls/--local_epochs 0" in err


@pytest.mark.parametrize("algorithm,mu,warned", [("Ditto", "0", True), ("Ditto+LAG", "0", True),
                                                 ("Ditto", "1", False), ("FedProx", "0", False)])
def test_ditto_without_its_pull_is_warned_about(algorithm, mu, warned, data_dir, tmp_path, capsys):
    # Ditto at PFLlib's default -mu 0 reports personal models that never meet the global one: Local.
    code, _, err = run_main(cli(data_dir, tmp_path, "-algo", algorithm, "-mu", mu, "-gr", "0"), capsys)
    assert code == 0 and ("warning: -mu 0 with Ditto" in err) == warned


# ----- item 13: the divergence message under Ray -------------------------------------------------

def test_a_divergence_error_keeps_its_message_across_processes():
    # Ray pickles a worker's exception to hand it to the driver.
    back = pickle.loads(pickle.dumps(DivergenceError(1)))
    assert str(back) == "client 1 reached a non-finite loss" and back.client_id == 1


# ----- item 16: a checksummed checkpoint is checked before it is trusted --------------------------

def test_only_declared_attributes_are_restored(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path)
    state = server.get_state()
    with pytest.raises(StateError, match=r"server\.results_dir_override: not an attribute"):
        server.set_state(dict(state, results_dir_override="/"))
    client_state = dict(state["clients"][0], train_data=None)
    with pytest.raises(StateError, match=r"clients\[0\]\.train_data: not an attribute"):
        server.set_state(dict(state, clients=[client_state] + state["clients"][1:]))
    assert server.clients[0].train_data is not None and not hasattr(server, "results_dir_override")


def test_a_state_that_does_not_fit_changes_nothing(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path)
    state = server.get_state()
    before = {k: v.clone() for k, v in server.clients[0].module_tensors().items()}
    play_round(server)
    trained = {k: v.clone() for k, v in server.clients[0].module_tensors().items()}
    bad = dict(state, clients=list(state["clients"]))
    bad["clients"][5] = dict(bad["clients"][5], model={"__module__": {"fc1.0.weight": torch.zeros(2)}})
    with pytest.raises(StateError, match=r"clients\[5\]\.model"):
        server.set_state(bad)
    assert all(torch.equal(v, trained[k]) for k, v in server.clients[0].module_tensors().items())
    assert not all(torch.equal(v, before[k]) for k, v in trained.items())


def test_the_resume_round_comes_from_the_payload_not_the_file_name(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-gr", "6", "--checkpoint_every", "1")
    play_round(server)
    server.current_round = 3
    path = run_of(server).save_checkpoint(3)
    for suffix in (".pt", ".sha256"):
        path.with_suffix(suffix).rename(path.parent / f"round_000001{suffix}")
    resumed = server_for(data_dir, tmp_path, "-gr", "6", "--checkpoint_every", "1")
    assert "resumed after round 3" in run_of(resumed).resume() and resumed.current_round == 4


def test_a_checkpoint_without_a_round_entry_uses_the_saved_round_counter(data_dir, tmp_path):
    server = server_for(data_dir, tmp_path, "-gr", "6", "--checkpoint_every", "1")
    server.current_round = 2
    payload = torch.load(run_of(server).save_checkpoint(2), weights_only=True)
    del payload["round"], payload["loop_done"]  # as written before those entries existed
    save_checkpoint(folder_of(server), 2, payload)
    resumed = server_for(data_dir, tmp_path, "-gr", "6", "--checkpoint_every", "1")
    assert "resumed after round 2" in run_of(resumed).resume() and resumed.current_round == 3


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS) + ["Ditto+LAG"])
def test_every_algorithms_own_state_passes_the_checks(algorithm, data_dir, tmp_path):
    """No false alarm: the state of a trained server fits a fresh one (through weights-only loading)."""
    extra = {"pFedMe": ["-bt", "1"], "PerAvg": ["-bt", "0.01"], "FedCAC": ["-bt", "1"], "FedPHP": ["-lam", "0.5"]}
    flags = ["-algo", algorithm, "-jr", "0.5", "-m", "CNN", *extra.get(algorithm, [])]
    original = server_for(data_dir, tmp_path, *flags)
    play_round(original)
    play_round(original)
    buffer = io.BytesIO()
    torch.save(original.get_state(), buffer)
    buffer.seek(0)
    twin = server_for(data_dir, tmp_path, *flags, "--seed", "3")
    twin.set_state(torch.load(buffer, weights_only=True))
    assert all(torch.equal(a, b) for a, b in zip(original.global_model.state_dict().values(),
                                                 twin.global_model.state_dict().values()))
