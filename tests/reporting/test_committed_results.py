"""Committed results name no folder of the machine that made them: a run's config records its data and
results folders, and a benchmark made with absolute ones would publish a path of that machine (HDF5 also
keeps an overwritten attribute's old bytes in its free space, so the raw bytes are what is checked)."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ABSOLUTE_FOLDER = re.compile(rb'"(data_dir|results_dir)": "(/|[A-Za-z]:\\\\)')


def committed_results():
    try:
        listed = subprocess.run(["git", "ls-files", "results"], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in listed.stdout.splitlines() if name.endswith((".h5", ".csv", ".json"))]


def test_no_committed_result_records_an_absolute_folder():
    files = committed_results()
    assert files, "no committed results found"
    offending = [str(f.relative_to(ROOT)) for f in files if f.exists() and ABSOLUTE_FOLDER.search(f.read_bytes())]
    assert offending == [], offending


def test_the_check_sees_an_absolute_folder_in_a_config():
    assert ABSOLUTE_FOLDER.search(b'{"data_dir": "/home/someone/dataset"}')
    assert ABSOLUTE_FOLDER.search(b'{"results_dir": "C:\\\\runs"}')
    assert not ABSOLUTE_FOLDER.search(b'{"data_dir": "dataset", "results_dir": "results/x"}')
