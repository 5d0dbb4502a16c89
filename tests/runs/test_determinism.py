"""Same command and seed -> identical .h5 arrays on the CPU; another seed -> different ones."""
import numpy as np

from utils.result_utils import read_results
from helpers import server_for, train, results_file

TIMING = {"rs_round_time"}


def run(data_dir, results_dir, *extra):
    server = server_for(data_dir, results_dir, "-jr", "0.5", "-cdr", "0.3", "-m", "CNN", *extra)
    train(server)
    return read_results(results_file(server))[0]


def test_same_seed_gives_identical_arrays(data_dir, tmp_path):
    a = run(data_dir, tmp_path / "a")
    b = run(data_dir, tmp_path / "b")
    assert set(a) == set(b)
    for name in set(a) - TIMING:
        assert np.array_equal(a[name], b[name]), name


def test_another_seed_gives_different_results(data_dir, tmp_path):
    a = run(data_dir, tmp_path / "a")
    c = run(data_dir, tmp_path / "c", "--seed", "1")
    assert not np.array_equal(a["rs_train_loss"], c["rs_train_loss"])
