"""Small guards of a run's files: names that are plain file names, ``--resume`` on a run that is complete
already, and no empty checkpoint folders left behind."""
import pytest

import main
from utils.result_utils import read_results, result_path
from helpers import cli

# Characters that make a file name unusable, or dangerous, when typed in a shell.
SHELL_HOSTILE = ["\n", "\t", " ", "*", "?", "[", "$", "'", '"', "`", ";", "|", "&", "<", ">", "(", "\\", "!", "~",
                 "#", "\0"]


@pytest.mark.parametrize("flag", ["-go", "-data"])
@pytest.mark.parametrize("character", SHELL_HOSTILE, ids=[repr(c) for c in SHELL_HOSTILE])
def test_names_holding_a_shell_hostile_character_are_refused_in_one_line(flag, character, data_dir, tmp_path, capsys):
    name = f"run{character}1"
    code = main.main(cli(data_dir, tmp_path, flag, name))
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    reason = "contains a path separator" if character == "\\" else f"contains the character {character!r}"
    assert lines[0] == (f"error: {flag}{'/--goal' if flag == '-go' else ''} {name!r} {reason}; it is part of a file "
                        f"name: use a plain name (letters, digits, '-', '.', '_', '+')")
    assert list(tmp_path.iterdir()) == []  # not even a lock
    assert "round" not in out


def test_resume_on_a_complete_run_says_so_and_runs_nothing(data_dir, tmp_path, capsys):
    flags = cli(data_dir, tmp_path, "-gr", "1", "--checkpoint_every", "1")
    assert main.main(flags) == 0
    h5 = result_path(tmp_path, "Toy", "FedAvg", "test", 0)
    before, stamp = read_results(h5)[0], h5.stat().st_mtime_ns
    capsys.readouterr()
    assert main.main(flags + ["--resume"]) == 0
    out = capsys.readouterr().out
    assert f"note: the run is complete already (results in {h5}); nothing to resume" in out
    assert "round 0/1" not in out and "round 1/1" not in out
    assert f"best accuracy {before['rs_test_acc'].max():.4f} | final {before['rs_test_acc'][-1]:.4f}" in out
    assert h5.stat().st_mtime_ns == stamp

    capsys.readouterr()  # another run's flags (more rounds): not complete, so it runs from round 0 ...
    longer = cli(data_dir, tmp_path, "-gr", "2", "--checkpoint_every", "1", "--resume")
    assert main.main(longer) == 2  # ... once allowed to replace the complete -gr 1 run
    assert "holds a complete run made with other flags (-gr 1 there, 2 here)" in capsys.readouterr().err
    assert main.main(longer + ["--overwrite"]) == 0
    out = capsys.readouterr().out
    assert "no checkpoint to resume from; starting from round 0" in out and "round 2/2" in out


def test_a_completed_run_leaves_no_empty_checkpoint_folders(data_dir, tmp_path):
    assert main.main(cli(data_dir, tmp_path, "-gr", "2", "--checkpoint_every", "1")) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Toy_FedAvg_test_0.csv", "Toy_FedAvg_test_0.h5"]
