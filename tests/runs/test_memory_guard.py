"""A run that cannot fit in memory is refused before its clients are built, in one line with what to change."""
import torch
from torch import nn

import app.memory as memory
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
    # The budget: as given, or half of what is left (never under two models' worth).
    assert memory.state_budget(model, data, 2, cpu, "2MiB") == 2 * 2**20
    assert memory.state_budget(model, data, 2, cpu, "auto") == (10_000 - 1740) // 2
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1800)
    assert memory.state_budget(model, data, 2, cpu, "auto") == 264
    monkeypatch.setattr(memory, "available_bytes", lambda device: None)
    assert memory.state_budget(model, data, 2, cpu, "auto") is None


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
