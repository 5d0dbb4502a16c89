"""The project installs as packages, and only entry scripts decide where imports come from."""
import os
import re
import sys
from pathlib import Path

from helpers import REPO

ENTRY_SCRIPTS = {"system/main.py", "system/report.py", "system/run_batch.py"}


def library_modules():
    for root in ("system", "dataset/utils"):
        for path in sorted((REPO / root).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel not in ENTRY_SCRIPTS:
                yield rel, path.read_text(encoding="utf-8")


def test_no_library_module_edits_sys_path():
    offenders = [rel for rel, text in library_modules() if re.search(r"sys\.path\s*(\.|\[|=)", text)]
    assert offenders == []


def test_pyproject_installs_one_package_and_no_generic_top_level_name():
    if sys.version_info < (3, 11):
        import pytest
        pytest.skip("tomllib is Python 3.11+")
    import tomllib
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert config["tool"]["setuptools"]["packages"] == ["pfl_lag_bench"]
    assert config["project"]["scripts"] == {"pfl-lag-bench": "pfl_lag_bench.__main__:main"}


def test_the_installed_package_runs_the_commands_from_anywhere(tmp_path):
    """What an editable install puts on the path is the repository root (where ``pfl_lag_bench`` lives),
    nothing of system/: the package itself makes the checkout's packages importable."""
    import subprocess
    env = dict(os.environ, PYTHONPATH=str(REPO))
    probe = ("import pfl_lag_bench, flcore.registry, app.run, grid.cli, dataset.utils.generate; "
             "print(flcore.registry.__file__)")
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_relative_to(REPO / "system")
    for command in ("run", "report", "grid"):
        done = subprocess.run([sys.executable, "-m", "pfl_lag_bench", command, "--help"], cwd=tmp_path, env=env,
                              capture_output=True, text=True)
        assert done.returncode == 0 and "usage" in done.stdout.lower(), (command, done.stderr[-500:])
    done = subprocess.run([sys.executable, "-m", "pfl_lag_bench", "train"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 2 and "run,report,grid" in done.stderr

