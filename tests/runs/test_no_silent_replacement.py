"""A run never silently replaces another: a complete run made with other flags under the same results
name is kept and the new run refused (naming the flags that differ) unless ``--overwrite``; an incomplete
or unreadable file it replaces is named in the run's first lines; a rerun of the same flags replaces its
own file without a word."""
import h5py

import main
from utils.result_utils import read_results, result_path, write_results
from helpers import cli


def run_main(data_dir, results, *flags):
    return main.main(cli(data_dir, results, "-algo", "FedAvg", "-gr", "1", *flags))


def h5_of(results):
    return result_path(results, "Toy", "FedAvg", "test", 0)


def test_a_complete_run_of_other_flags_is_kept_and_the_new_run_refused(data_dir, tmp_path, capsys):
    assert run_main(data_dir, tmp_path) == 0
    before = h5_of(tmp_path).read_bytes()
    capsys.readouterr()
    assert run_main(data_dir, tmp_path, "-gr", "2", "-lr", "0.1") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1
    assert "holds a complete run made with other flags (-lr 0.05 there, 0.1 here; -gr 1 there, 2 here)" in err
    assert "--overwrite" in err and "-go/--goal" in err
    assert h5_of(tmp_path).read_bytes() == before  # untouched


def test_another_seed_under_the_same_name_is_another_run(data_dir, tmp_path, capsys):
    assert run_main(data_dir, tmp_path) == 0
    capsys.readouterr()
    assert run_main(data_dir, tmp_path, "--seed", "3") == 2
    assert "--seed 0 there, 3 here" in capsys.readouterr().err


def test_overwrite_replaces_it_and_says_so_first(data_dir, tmp_path, capsys):
    assert run_main(data_dir, tmp_path) == 0
    capsys.readouterr()
    assert run_main(data_dir, tmp_path, "-gr", "2", "--overwrite") == 0
    out = capsys.readouterr().out
    note = next(line for line in out.splitlines() if line.startswith("note: replacing"))
    assert "a complete run made with other flags (-gr 1 there, 2 here)" in note
    assert out.index(note) < out.index("round 0/")
    arrays, attrs = read_results(h5_of(tmp_path))
    assert attrs["config"]["global_rounds"] == 2 and len(arrays["rs_test_acc"]) == 3


def test_a_rerun_of_the_same_flags_replaces_its_file_without_a_word(data_dir, tmp_path, capsys):
    assert run_main(data_dir, tmp_path) == 0
    capsys.readouterr()
    # Flags that say only where and how a run executes do not make another run.
    assert run_main(data_dir, tmp_path, "--state_memory", "1G") == 0
    assert "replacing" not in capsys.readouterr().out


def test_an_incomplete_run_of_other_flags_is_replaced_with_a_note(data_dir, tmp_path, capsys):
    assert run_main(data_dir, tmp_path) == 0
    with h5py.File(h5_of(tmp_path), "r+") as f:
        f.attrs["complete"] = False
    capsys.readouterr()
    assert run_main(data_dir, tmp_path, "-gr", "2") == 0
    assert "note: replacing" in capsys.readouterr().out
    assert read_results(h5_of(tmp_path))[1]["complete"]


def test_an_unreadable_file_is_replaced_with_a_note(data_dir, tmp_path, capsys):
    tmp_path.mkdir(exist_ok=True)
    h5_of(tmp_path).write_bytes(b"not an h5 file")
    assert run_main(data_dir, tmp_path) == 0
    assert "which is not a readable results file" in capsys.readouterr().out


def test_a_file_from_an_older_version_is_compared_on_the_flags_it_records(data_dir, tmp_path, capsys):
    write_results(h5_of(tmp_path), {"rs_test_acc": [0.5]}, {"complete": True, "config": {"global_rounds": 1}})
    assert run_main(data_dir, tmp_path) == 0  # every flag it records is this run's: nothing is lost
    write_results(h5_of(tmp_path), {"rs_test_acc": [0.5]}, {"complete": True, "config": {"global_rounds": 7}})
    capsys.readouterr()
    assert run_main(data_dir, tmp_path) == 2
    assert "-gr 7 there, 1 here" in capsys.readouterr().err


def test_a_run_made_with_overwrite_is_the_same_run_without_it(data_dir, tmp_path, capsys):
    assert run_main(data_dir, tmp_path, "--overwrite") == 0
    capsys.readouterr()
    assert run_main(data_dir, tmp_path) == 0
    assert "replacing" not in capsys.readouterr().out
