"""A run that cannot fit in memory is refused before its clients are built, in one line with what to change;
the budget of the clients' own state, said before round 0."""
import torch
from torch import nn

import app.memory as memory
import main
from helpers import REPO, cli
from utils.datasets import DatasetInfo


def info(train, test, shape=(1, 8, 8), kind="image"):
    return DatasetInfo("T", None, len(train), 4, shape, tuple(train), tuple(test), input_kind=kind)


def test_the_estimate_by_hand():
    model = nn.Linear(10, 3)                             # 33 float32 values: 132 bytes
    assert memory.model_bytes(model) == 132
    data = info([5, 7], [1, 2])                          # 15 samples x (64 one-byte codes + an int64 label)
    assert memory.data_bytes(data, 2) == 15 * (64 + 8)
    assert memory.data_bytes(data, 1) == 6 * (64 + 8)    # only the run's clients count
    tokens = info([3], [1], shape=(20,), kind="tokens")
    assert memory.data_bytes(tokens, 1) == 4 * (20 * 8 + 8)
    # Clients keep no model of their own before round 0: five copies whatever the client count.
    assert memory.needed_bytes(model, data, 2) == 5 * 132 + 15 * 72
    assert memory.needed_bytes(model, info([5] * 1000, [1] * 1000), 1000) == 5 * 132 + 6000 * 72


def test_a_run_that_cannot_fit_is_refused_in_one_line_naming_what_to_change(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1000)
    problem = memory.memory_problem(nn.Linear(10, 3), info([5, 7], [1, 2]), 2, torch.device("cpu"), "MLR")
    assert problem.startswith("this run needs at least 1.7 KB before round 0 (5 copies of MLR at 132 B each")
    assert "the cpu has 1.0 KB free; lower -nc, choose a smaller -m" in problem
    monkeypatch.setattr(memory, "available_bytes", lambda device: None)  # cannot be told: no refusal
    assert memory.memory_problem(nn.Linear(10, 3), info([5, 7], [1, 2]), 2, torch.device("cpu"), "MLR") is None


def test_a_state_budget_beyond_what_is_free_is_refused_naming_state_memory(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda device: 10_000)
    model, data = nn.Linear(10, 3), info([5, 7], [1, 2])  # the run needs 660 + 1080 = 1740 bytes
    cpu = torch.device("cpu")
    assert memory.memory_problem(model, data, 2, cpu, "MLR", "8KB") is None          # 1740 + 8000 fits
    problem = memory.memory_problem(model, data, 2, cpu, "MLR", "9KB")
    assert problem.startswith("--state_memory 9KB and the run's models and data (1.7 KB) exceed the 10.0 KB")
    assert "lower --state_memory" in problem
    # auto keeps at least four models' worth (528 bytes): 1740 + 528 must fit too.
    assert memory.memory_problem(model, data, 2, cpu, "MLR") is None
    monkeypatch.setattr(memory, "available_bytes", lambda device: 2200)
    problem = memory.memory_problem(model, data, 2, cpu, "MLR")
    assert problem.startswith("the run's models and data (1.7 KB) and the least memory kept for the clients' own "
                              "state (4 copies of MLR, 528 B) exceed the 2.2 KB the cpu has free")


def test_the_default_keeps_every_client_in_memory_where_all_surely_fit(monkeypatch):
    """Two clients of a 132-byte model, each counted at 4 models (528 bytes): within half of what is free."""
    model, data, cpu = nn.Linear(10, 3), info([5, 7], [1, 2]), torch.device("cpu")  # needs 1740 bytes
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1740 + 64_000)
    assert memory.chosen_state_budget(model, data, 2, cpu, "auto") == (
        32_000, "auto: every client's state fits in half of the 64.0 KB the cpu has free beyond models and data")
    assert memory.state_budget(model, data, 121, cpu, "auto") == 1000     # 121 x 528 = 63,888 bytes: 1/64
    assert memory.state_budget(model, data, 60, cpu, "auto") == 32_000    # 60 x 528 = 31,680: still all


def test_the_default_budget_is_a_64th_of_what_is_free_where_the_clients_cannot_all_fit(monkeypatch):
    model, data, cpu = nn.Linear(10, 3), info([5, 7], [1, 2]), torch.device("cpu")  # needs 1740 bytes
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1740 + 64_000)
    assert memory.state_budget(model, data, 1000, cpu, "auto") == 1000
    assert memory.chosen_state_budget(model, data, 1000, cpu, "auto") == (
        1000, "auto: 1/64 of the 64.0 KB the cpu has free beyond models and data")
    # 21 GB left, as on the machine of the scale benchmark: 328 MB, about 7 ResNet18s (44.7 MB each).
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1740 + 21 * 10**9)
    assert memory.state_budget(model, data, 10**8, cpu, "auto") == 21 * 10**9 // 64 == 328_125_000


def test_the_default_budget_never_falls_under_four_models(monkeypatch):
    model, data, cpu = nn.Linear(10, 3), info([5, 7], [1, 2]), torch.device("cpu")  # 132-byte model
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1740 + 64 * 527)  # a 64th is 527 bytes
    assert memory.chosen_state_budget(model, data, 1000, cpu, "auto") == (
        528, "auto: 4 models' worth, the least it keeps, over 1/64 of the 33.7 KB the cpu has free beyond models "
             "and data")
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1740 + 64 * 528)  # exactly the floor
    assert memory.state_budget(model, data, 1000, cpu, "auto") == 528
    monkeypatch.setattr(memory, "available_bytes", lambda device: None)  # cannot be told: no limit
    assert memory.chosen_state_budget(model, data, 1000, cpu, "auto") == (
        None, "auto: what the cpu has free cannot be told")


def test_a_budget_given_by_size_is_that_size_whatever_is_free(monkeypatch):
    model, data, cpu = nn.Linear(10, 3), info([5, 7], [1, 2]), torch.device("cpu")
    for free in (None, 2000, 10**12):
        monkeypatch.setattr(memory, "available_bytes", lambda device: free)
        assert memory.state_budget(model, data, 2, cpu, "2MiB") == 2 * 2**20
        assert memory.chosen_state_budget(model, data, 2, cpu, "100") == (100, "--state_memory 100")


def test_the_opening_lines_say_the_budget(data_dir, tmp_path, monkeypatch, capsys):
    """Before round 0, one line: how much own client state stays in memory, how that was chosen, and where
    the rest goes."""
    monkeypatch.setattr(memory, "needed_bytes", lambda model, info, clients: 0)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 64 * 10**8)
    assert main.main(cli(data_dir, tmp_path, "-gr", "0", "--threads", "1")) == 0
    lines = capsys.readouterr().out.splitlines()
    said = [i for i, line in enumerate(lines) if line.startswith("client state: ")]
    first_round = next(i for i, line in enumerate(lines) if line.startswith("round 0"))
    assert len(said) == 1 and said[0] < first_round and said[0] <= 4
    assert lines[said[0]].startswith("client state: up to 3.2 GB in memory (auto: every client's state fits in "
                                     "half of the 6.4 GB the cpu has free beyond models and data), beyond it in "
                                     "files under ")
    assert lines[said[0]].endswith("client-state")
    assert main.main(cli(data_dir, tmp_path / "given", "-gr", "0", "--threads", "1", "--state_memory", "2G")) == 0
    assert "client state: up to 2.0 GB in memory (--state_memory 2G), beyond it in files under " in \
        capsys.readouterr().out


def test_the_machine_says_how_much_is_free():
    free = memory.available_bytes(torch.device("cpu"))
    assert free is None or free > 0


def test_the_command_line_refuses_before_building_clients(data_dir, tmp_path):
    """Too little free memory (a tiny figure in place of the machine's), in the real command: one line,
    status 2, nothing written."""
    limit = 2000
    import subprocess
    import sys
    probe = (f"import sys; sys.path[:0] = [{str(REPO / 'system')!r}, {str(REPO)!r}]; import app.memory as m; "
             f"m.available_bytes = lambda device: {limit}; import main; sys.exit(main.main(sys.argv[1:]))")
    flags = cli(data_dir, tmp_path, "-gr", "0")
    done = subprocess.run([sys.executable, "-c", probe, *flags, "--threads", "1"], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().startswith("error: this run needs at least") and len(done.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.glob("*.h5"))
