"""What the commands say: a bad flag in one line pointing at --help, a download's reason never cut
mid-word, the rounds a run and a grid really train, and one thread count in every document."""
import re
from urllib.error import URLError

import pytest

import main
import report
from dataset.utils.command_line import parse_args as generator_args
from dataset.utils.natural import parse_args as natural_generator_args
from dataset.utils.one_line import OneLineParser, refusal, shortened
from dataset.utils.raw_data import DownloadError
from dataset.utils.torchvision_splits import load_torchvision
from grid.cli import main as run_all_main
from grid.launcher import RUN_THREADS
from helpers import REPO
from utils.rounds import rounds_run


# ----- a missing or bad flag value: one line, and where the help is ----------------------------------
@pytest.mark.parametrize("command,argv,what,help_command", [
    (main.main, ["-gr"], "argument -gr/--global_rounds: expected one argument", "python system/main.py --help"),
    (main.main, ["-jr", "2"], "-jr/--join_ratio must be in (0, 1], got 2.0", "python system/main.py --help"),
    (main.main, ["--no_such_flag"], "unrecognized arguments: --no_such_flag", "python system/main.py --help"),
    (report.main, ["--last-k"], "argument --last-k: expected one argument", "python system/report.py --help"),
    (report.main, ["--last-k", "0"], "--last-k must be >= 1", "python system/report.py --help"),
    (lambda argv: generator_args(argv, "MNIST", 2, None), ["--alpha"], "argument --alpha: expected one argument",
     "python dataset/generate_MNIST.py --help"),
    (lambda argv: natural_generator_args(argv, "HAR", "subject", "HAR", "a zip"), ["--num-clients"],
     "argument --num-clients: expected one argument", "python dataset/generate_HAR.py --help"),
])
def test_a_bad_flag_is_one_line_naming_the_help_not_the_usage(command, argv, what, help_command, capsys):
    with pytest.raises(SystemExit) as stop:
        command(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.count("\n") == 1 and "usage" not in err.lower(), err
    assert err.startswith(f"error: {what}") and err.rstrip().endswith(f"({help_command} lists every flag)")


def test_run_all_refuses_a_missing_value_in_one_line(capsys):
    assert run_all_main(["-r"]) == 2
    assert capsys.readouterr().err == "run_all.sh: -r needs a value (see --help)\n"   # already one line


def test_the_bare_refusal_is_recovered_from_the_printed_line():
    parser = OneLineParser(prog="x", help_command="python x.py --help")
    parser.add_argument("--mode", choices=("a", "b"))
    with pytest.raises(SystemExit):
        parser.parse_args(["--mode", "c"])
    printed = "error: argument --mode: invalid choice: 'c' (choose from 'a', 'b') (python x.py --help lists every flag)"
    assert refusal(printed) == "argument --mode: invalid choice: 'c' (choose from 'a', 'b')"
    assert refusal("error: -x must be >= 0") == "-x must be >= 0"


# ----- a download's reason: whole words -----------------------------------------------------------------
def test_a_long_reason_is_cut_after_a_whole_word():
    assert shortened("short enough", 12) == "short enough"
    assert shortened("Tried http://a/mnist/, got: refused", 30) == "Tried http://a/mnist/ ..."
    assert shortened("Tried http://a/mnist/, got: refused", 31) == "Tried http://a/mnist/, got ..."
    assert shortened("one two three", 12) == "one two ..."      # "one two three" is 13
    assert shortened("abcdefghijklmnop", 10) == "abcdef ..."    # no space: cut, but marked
    assert shortened("a\n  b\tc", 99) == "a b c"
    for limit in range(5, 40):
        text = shortened("Tried https://ossci-datasets.s3.amazonaws.com/mnist/, got: <urlopen error>", limit)
        assert len(text) <= limit


class _MirrorsDown:
    """A torchvision-style dataset whose download fails with a reason of ``words`` words, as torchvision's
    MNIST does when every mirror is unreachable."""
    words = 200

    def __init__(self, root, train, download):
        raise URLError(" ".join(f"Tried http://mirror{i}/mnist/, got: refused;" for i in range(self.words)))


def test_an_offline_download_names_the_mirrors_without_cutting_a_word(tmp_path):
    with pytest.raises(DownloadError) as err:
        load_torchvision(_MirrorsDown, tmp_path / "raw")
    message = str(err.value)
    reason = message[message.index("(") + 1:message.index("); build it offline")]
    assert reason.startswith("Tried http://mirror0/mnist/, got: refused; Tried http://mirror1/")
    assert reason.endswith(" ...") and re.search(r"(refused|got|Tried|http://mirror\d+/mnist/,) \.\.\.$", reason)
    assert "--source FILE.npz" in message


# ----- what -gr N runs ------------------------------------------------------------------------------------
def test_rounds_are_said_as_they_run():
    assert rounds_run(0) == "round 0 (1 round)"
    assert rounds_run(1) == "rounds 0..1 (2 rounds)"
    assert rounds_run(20) == "rounds 0..20 (21 rounds)"


def test_run_all_announces_the_rounds_each_run_trains(tmp_path, capsys):
    assert run_all_main(["--dry-run", "-a", "FedAvg", "-d", "Digits", "-p", "iid", "-s", "0", "-r", "20",
                         "--data_dir", str(tmp_path / "data"), "--results_dir", str(tmp_path / "results")]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "-gr 20: rounds 0..20 (21 rounds)" in first and "| 20 rounds" not in first


# ----- one thread per grid run, in every document that says so -----------------------------------------
@pytest.mark.parametrize("document", ["results/README.md", "docs/batches-and-reports.md"])
def test_documents_give_each_grid_run_the_launchers_thread_count(document):
    text = " ".join((REPO / document).read_text(encoding="utf-8").split())
    sentence = re.search(r"`-j N`[^.]*?`OMP_NUM_THREADS ?= ?(\d+)`", text)
    assert sentence, f"{document} does not say what -j N gives each run"
    assert int(sentence.group(1)) == RUN_THREADS == 1
