"""The intra-op thread count: one unless ``--threads N`` or an exported OMP_NUM_THREADS asks for another."""
import torch

from app.build import prepare
from app.options import parse_args
from app.threads import DEFAULT_THREADS, run_threads
from helpers import cli


def test_the_thread_count_is_one_unless_asked_for():
    assert run_threads(0, {}) == DEFAULT_THREADS == 1
    assert run_threads(3, {"OMP_NUM_THREADS": "2"}) == 3          # --threads N wins
    assert run_threads(0, {"OMP_NUM_THREADS": "2"}) is None       # torch already took the exported count
    assert run_threads(0, {"MKL_NUM_THREADS": "4"}) is None
    assert run_threads(0, {"OMP_NUM_THREADS": " "}) == 1          # set but empty: not a request


def test_prepare_sets_one_thread_by_default_and_leaves_an_exported_count(data_dir, tmp_path, monkeypatch):
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        prepare(parse_args(cli(data_dir, tmp_path)))
        assert torch.get_num_threads() == 1
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        torch.set_num_threads(2)
        prepare(parse_args(cli(data_dir, tmp_path)))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
