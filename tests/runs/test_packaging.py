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
    nothing of system/: the package itself makes the checkout's packages importable, and runs the three
    commands (one process for all of it; argparse's ``--help`` exits through SystemExit)."""
    import subprocess
    probe = "\n".join([
        "import contextlib, io, sys",
        "import pfl_lag_bench.__main__ as cli, flcore.registry",
        "print(flcore.registry.__file__)",
        "for command in ('run', 'report', 'grid'):",
        "    out = io.StringIO()",
        "    try:",
        "        with contextlib.redirect_stdout(out):",
        "            code = cli.main([command, '--help'])",
        "    except SystemExit as stop:",
        "        code = stop.code",
        "    print(command, code, 'usage' in out.getvalue().lower())",
        "print('unknown', cli.main(['train']))"])
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert Path(lines[0]).is_relative_to(REPO / "system")
    assert lines[1:] == ["run 0 True", "report 0 True", "grid 0 True", "unknown 2"]
    assert "run,report,grid" in done.stderr


def test_help_is_the_usage_on_stdout_under_the_name_it_was_called_by(monkeypatch, capsys):
    import pfl_lag_bench.__main__ as cli
    for argv0, name in (("/venv/bin/pfl-lag-bench", "pfl-lag-bench"),
                        ("/repo/pfl_lag_bench/__main__.py", "python -m pfl_lag_bench")):
        monkeypatch.setattr(sys, "argv", [argv0])
        for ask in (["--help"], ["-h"], []):
            assert cli.main(ask) == 0
            out, err = capsys.readouterr()
            assert out.startswith(f"usage: {name} {{run,report,grid}}") and err == ""
        assert cli.main(["train"]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.startswith(f"usage: {name} ") and err.rstrip().endswith("unknown command 'train'")
