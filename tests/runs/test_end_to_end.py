"""The real command line, twice: from the repository root and from inside system/."""
import subprocess
from pathlib import Path

import numpy as np
import pytest

from utils.result_utils import read_results
from helpers import REPO, main_command


@pytest.mark.crossprocess
def test_two_rounds_on_digits_from_root_and_from_system(tmp_path):
    data, results = tmp_path / "data", tmp_path / "results"
    common = ["-algo", "FedAvg", "-gr", "2", "-dev", "cpu", "--data_dir", str(data), "--results_dir", str(results)]
    first = subprocess.run(main_command(*common, "-go", "root", script=Path("system/main.py")), cwd=REPO,
                           capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert (data / "Digits" / "config.json").is_file()  # built on first use
    second = subprocess.run(main_command(*common, "-go", "inside", script=Path("main.py")), cwd=REPO / "system",
                            capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    assert "round 2/2 | acc" in first.stdout
    a, attrs = read_results(results / "Digits_FedAvg_root_0.h5")
    b, _ = read_results(results / "Digits_FedAvg_inside_0.h5")
    assert len(a["rs_test_acc"]) == 3 and len(a["rs_test_auc"]) == 3 and len(a["rs_round_time"]) == 3
    assert np.array_equal(a["rs_test_acc"], b["rs_test_acc"])  # the working directory changes nothing
    assert attrs["config"]["algorithm"] == "FedAvg" and attrs["config"]["num_clients"] == 20
    assert attrs["config"]["results_dir"] == str(results)  # outside the repository: kept as given
