"""A new user's first hour: offline datasets, typos, --help, the bare command, progress during long rounds, report
tables."""
import fcntl
import io
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from urllib.error import URLError

import numpy as np
import pytest

import main
from helpers import REPO, main_command
from dataset.utils.raw_data import DownloadError
from dataset.utils.torchvision_splits import load_torchvision
from flcore.registry import ALGORITHMS, UnknownAlgorithmError, algorithm_groups, resolve, valid_names
from utils.names import closest_names
from flcore.trainmodel.models import MODELS, UnknownModelError
from reporting.grouping import group_runs
from reporting.runs import find_runs, load_runs
from reporting.tables import markdown_table
from utils import progress
from app.options import QUICKSTART, build_parser, check_model_name, parse_args
from utils.result_utils import result_path, write_results

# Every proxy variable pointed at a port where nothing listens: a download fails at once, whether or not
# the machine has a network.
OFFLINE = {name: "http://127.0.0.1:9" for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")}


def run_main(*flags, env=None, **kw):
    return subprocess.run(main_command(*flags), capture_output=True, text=True, env=env, **kw)


# ----- item 2: a generator without network ------------------------------------------------------------
def test_generator_offline_fails_in_one_line_naming_source_and_leaves_nothing(tmp_path):
    raw_parent = tmp_path / "data" / "FashionMNIST"  # where the generator downloads to (under --root)
    proc = subprocess.run([sys.executable, str(REPO / "dataset" / "generate_FashionMNIST.py"), "noniid", "-", "dir",
                           "--root", str(tmp_path / "data")], capture_output=True, text=True,
                          env=dict(os.environ, **OFFLINE), timeout=120)
    output = (proc.stdout + proc.stderr).strip()
    assert proc.returncode != 0
    assert len(output.splitlines()) == 1 and "Traceback" not in output, output
    assert "--source FILE.npz" in output and "uint8" in output and "'y'" in output
    assert not raw_parent.exists(), "the failed download left its folder behind"
    assert not (tmp_path / "data").exists()


class _FailingDownload:
    """A torchvision-style dataset class whose download writes a partial file, then loses the network."""

    def __init__(self, root, train, download):
        os.makedirs(os.path.join(root, "sub"), exist_ok=True)
        with open(os.path.join(root, "sub", "partial.gz"), "wb") as f:
            f.write(b"\x1f\x8b")
        raise URLError("[Errno 111] Connection refused")


def test_failed_download_removes_only_what_it_created(tmp_path):
    raw = tmp_path / "Name" / "rawdata"
    with pytest.raises(DownloadError, match="--source FILE.npz"):
        load_torchvision(_FailingDownload, raw)
    assert not (tmp_path / "Name").exists()          # folders it had to create are gone
    raw.mkdir(parents=True)
    (raw / "earlier.bin").write_bytes(b"kept")
    with pytest.raises(DownloadError, match="Connection refused"):
        load_torchvision(_FailingDownload, raw)
    assert sorted(p.name for p in raw.rglob("*")) == ["earlier.bin"]  # what was there before stays


def test_missing_dataset_hint_names_the_offline_source(tmp_path):
    proc = run_main("-algo", "FedLAG", "-data", "Cifar10", "-m", "ResNet9", "--data_dir", str(tmp_path))
    assert proc.returncode == 2
    assert "generate_Cifar10.py" in proc.stderr and "--source FILE.npz" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# ----- item 3: typos get the closest name, before anything is loaded ---------------------------------
def test_closest_names_prefer_a_case_insensitive_match_then_similarity():
    assert closest_names("FedLag", valid_names()) == ["FedLAG"]
    assert closest_names("resnet9", MODELS) == ["ResNet9"]
    assert closest_names("scafold", valid_names()) == ["SCAFFOLD"]
    assert closest_names("FedAwg", valid_names()) == ["FedAvg", "FedLAG"]   # a tie names both
    assert closest_names("Xyz", valid_names()) == []


def test_wrong_case_algorithm_suggests_the_right_one_not_the_whole_list():
    with pytest.raises(UnknownAlgorithmError) as err:
        resolve("FedLag")
    assert "did you mean 'FedLAG'?" in str(err.value) and "FedFomo" not in str(err.value)
    with pytest.raises(UnknownAlgorithmError) as err:
        resolve("Nothing-like-it")
    assert "reference: FedAvg, Local, FedLAG" in str(err.value)   # no close name: the grouped list


def test_wrong_model_is_refused_before_any_dataset_is_built_or_read(tmp_path):
    # Digits would be partitioned under --data_dir on first use: the model is checked first.
    proc = run_main("-m", "resnet9", "-dev", "cpu", "--data_dir", str(tmp_path / "data"),
                    "--results_dir", str(tmp_path / "results"))
    assert proc.returncode == 2
    assert "unknown model 'resnet9'; did you mean 'ResNet9'?" in proc.stderr
    assert proc.stdout == "" and not (tmp_path / "data").exists()
    with pytest.raises(UnknownModelError, match="did you mean 'CNN'"):
        check_model_name("cnn")


def test_wrong_case_dataset_suggests_the_existing_generator(tmp_path):
    proc = run_main("-data", "cifar10", "--data_dir", str(tmp_path))
    assert proc.returncode == 2
    assert "did you mean -data Cifar10?" in proc.stderr
    assert "python dataset/generate_Cifar10.py" in proc.stderr and "a generator that writes" not in proc.stderr


# ----- item 4: --help ---------------------------------------------------------------------------------
def help_entries(text):
    """{first option string: its help text} from argparse's --help output."""
    entries, name = {}, None
    for line in text.split("options:", 1)[1].splitlines():
        match = re.match(r"^  (-{1,2}[\w-]+)", line)
        if match:
            name = match.group(1)
            entries[name] = line
        elif name and line.strip():
            entries[name] += " " + line.strip()
    return {k: " ".join(v.split()) for k, v in entries.items()}


def test_help_gives_every_flag_a_text_and_its_default_once():
    parser = build_parser()
    text = parser.format_help()
    assert "(default: None)" not in text
    entries = help_entries(text)
    flags = [a.option_strings[0] for a in parser._actions if a.option_strings and a.dest != "help"]
    assert set(flags) <= set(entries)
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        assert action.help, f"{action.option_strings[0]} has no help text"
        entry = entries[action.option_strings[0]]
        assert entry.count("(default") == 1, f"{action.option_strings[0]}: {entry}"


def test_help_lists_algorithms_grouped_models_and_datasets():
    entries = help_entries(build_parser().format_help())
    algo = entries["-algo"]
    groups = algorithm_groups()
    assert list(groups) == ["reference", "layer split / personal heads", "regularised / full model",
                            "personalised copies", "clustered", "knowledge sharing"]
    for group, names in groups.items():
        assert f"{group}: {', '.join(names)}" in algo
    assert [n for names in groups.values() for n in names] == list(ALGORITHMS)
    assert "X+LAG" in algo
    assert all(m in entries["-m"] for m in MODELS)
    assert all(d in entries["-data"] for d in ("Digits", "MNIST", "Cifar10", "--source"))


def test_the_readme_algorithm_table_follows_the_registry_grouping():
    """The README's Algorithms table (documentation, so it may lag behind a new row or a new group) lists
    registry groups in the registry's order, and each name in its registry group, in the rows' order (a
    row's remarks in parentheses aside)."""
    text = (REPO / "README.md").read_text()
    table = text[text.index("| group | algorithms |"):].split("\n\n")[0].splitlines()[2:]
    rows = {}
    for line in table:
        group, names = (cell.strip() for cell in line.strip("|").split("|"))
        rows[re.sub(r" \(.*\)$", "", group)] = re.findall(r"`([^`]+)`", re.sub(r"\(.*?\)", "", names))
    groups = algorithm_groups()
    assert list(rows) == [group for group in groups if group in rows]
    for group, names in rows.items():
        assert names and names == [n for n in groups[group] if n in names], group


# ----- a bare command ----------------------------------------------------------------------------------
def test_no_flag_at_all_runs_the_quickstart_and_any_flag_keeps_pfllibs_defaults(monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(main, "run", lambda config, argv=(): ran.append(config))
    assert main.main([]) == 0
    assert ran[0] == parse_args(list(QUICKSTART))
    assert (ran[0].algorithm, ran[0].dataset, ran[0].global_rounds) == ("FedLAG", "Digits-iid-lg4", 100)
    assert "running the quickstart, python system/main.py -algo FedLAG" in capsys.readouterr().out
    assert main.main(["-gr", "3"]) == 0
    assert (ran[1].algorithm, ran[1].dataset, ran[1].num_clients, ran[1].global_rounds) == ("FedAvg", "Digits", 20, 3)
    assert "quickstart" not in capsys.readouterr().out


# ----- item 5: progress inside a round ----------------------------------------------------------------
def read_terminal(master: int, until_closed: bool = False, limit: float = 5.0) -> bytes:
    """What was written to a pseudo-terminal: what is there now, or (``until_closed``) all of it until
    the other side closes; never waits longer than ``limit`` seconds."""
    chunks, deadline = [], time.monotonic() + limit
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5 if until_closed else 0.2)
        if not ready:
            if until_closed:
                continue
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:   # the child closed its side
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def test_reporter_shows_the_round_stage_on_a_terminal_only():
    master, slave = os.openpty()   # a terminal that reports no width: the line must still show
    tty = os.fdopen(slave, "w", closefd=True)
    try:
        reporter = progress.RoundReporter(3, title="FedAvg on Toy", stream=tty)
        assert progress.current() is reporter
        reporter.begin("train", 5)
        for _ in range(5):
            reporter.advance()
        reporter.begin("evaluate", 5)
        reporter.advance(5)
        reporter.close()
        tty.flush()
        shown = read_terminal(master).decode(errors="replace")   # read while the terminal is open
    finally:
        tty.close()
        os.close(master)
    assert "train 5/5" in shown and "evaluate 5/5" in shown
    assert isinstance(progress.current(), progress.QuietProgress) and progress.current() is not reporter

    log = io.StringIO()   # not a terminal: no live line, round lines only
    reporter = progress.RoundReporter(2, stream=log)
    reporter.begin("train", 4)
    reporter.advance(4)
    reporter.round_done(0, 1.5, None)
    reporter.close()
    assert log.getvalue() == "round 0/1 | 1.50 s\n"


def test_a_run_on_a_terminal_reports_clients_trained_and_evaluated(data_dir, tmp_path):
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))   # 40 rows x 200 columns
    proc = subprocess.Popen(main_command("-data", "Toy", "-nc", "6", "-gr", "1", "-dev", "cpu", "-m", "DNN",
                                         "--data_dir", str(data_dir), "--results_dir", str(tmp_path)),
                            stdout=slave, stderr=slave)
    os.close(slave)
    try:
        shown = read_terminal(master, until_closed=True, limit=120).decode(errors="replace")
    finally:
        os.close(master)
    assert proc.wait(timeout=60) == 0, shown
    assert "train 6/6" in shown and "evaluate 6/6" in shown


def test_redirected_output_has_one_line_per_round_and_says_when_it_partitions(tmp_path):
    proc = run_main("-gr", "1", "-dev", "cpu", "--data_dir", str(tmp_path / "data"),
                    "--results_dir", str(tmp_path / "results"), timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("first use of Digits: partitioning it into 20 clients")
    assert "| rounds 0..1 (2 rounds) |" in lines[1]   # -gr 1 trains two rounds, and the header says so
    assert len([line for line in lines if line.startswith("round ")]) == 2
    assert "train " not in proc.stdout and "\r" not in proc.stdout and proc.stderr == ""


# ----- item 7: report tables ------------------------------------------------------------------------
def write_run(folder, dataset, algorithm, run, acc, goal="g", **config):
    cfg = {"dataset": dataset, "algorithm": algorithm, "goal": goal, "model": "CNN", "seed": run,
           "local_learning_rate": 0.005, "global_rounds": 20, "torch_version": "2.x", **config}
    path = result_path(folder, dataset, algorithm, goal, run)
    write_results(path, {"rs_test_acc": np.asarray(acc), "rs_eval_round": np.arange(len(acc))},
                  {"config": cfg, "run": run, "algorithm": algorithm, "dataset": dataset, "complete": True})


def test_one_seed_prints_the_value_alone_and_says_so(tmp_path):
    import report
    write_run(tmp_path, "MNIST-dir0.1", "FedAvg", 0, [0.3, 0.4])
    write_run(tmp_path, "MNIST-dir0.1", "FedLAG", 0, [0.3, 0.5])
    tables = report.tables_markdown(group_runs(load_runs(find_runs([tmp_path]))[0]))
    assert "± 0.00" not in tables
    assert "| FedLAG | **50.00** |" in tables
    assert "One seed per cell" in tables


def test_columns_of_one_dataset_with_other_settings_name_the_flags_that_differ(tmp_path):
    for seed in (0, 1):
        write_run(tmp_path, "Digits", "FedAvg", seed, [0.5, 0.6 + seed / 10])
        write_run(tmp_path, "Digits-dir0.1", "FedAvg", seed, [0.4, 0.7], local_learning_rate=0.05,
                  global_rounds=10, torch_version="other")   # the torch build is not a setting
    header = markdown_table(group_runs(load_runs(find_runs([tmp_path]))[0])).splitlines()[0]
    columns = [c.strip() for c in header.strip("|").split("|")][1:]
    assert len(columns) == 2
    assert {c.split(" (")[1] for c in columns} == {"-gr 20, -lr 0.005)", "-gr 10, -lr 0.05)"}
    assert all("torch" not in c for c in columns)


def test_rows_split_by_goal_and_runs_of_other_settings_are_never_averaged(tmp_path):
    import report
    write_run(tmp_path, "MNIST-dir0.1", "FedAvg", 0, [0.5], goal="a")
    write_run(tmp_path, "MNIST-dir0.1", "FedAvg", 0, [0.6], goal="b", local_learning_rate=0.1)
    write_run(tmp_path, "MNIST-dir0.1", "FedLAG", 0, [0.6], goal="b", local_learning_rate=0.1)
    write_run(tmp_path, "MNIST-dir0.1", "FedLAG", 1, [0.6], goal="b", local_learning_rate=0.2)
    tables = report.tables_markdown(group_runs(load_runs(find_runs([tmp_path]))[0]))
    assert "| FedAvg (a; -lr 0.005) |" in tables and "| FedAvg (b; -lr 0.1) |" in tables
    assert "| FedLAG (b; -lr 0.1) |" in tables and "| FedLAG (b; -lr 0.2) |" in tables
