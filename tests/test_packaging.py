"""The project installs as packages, and only entry scripts decide where imports come from."""
import re
import sys

from conftest import REPO

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


def test_pyproject_installs_every_package_of_the_layout():
    if sys.version_info < (3, 11):
        import pytest
        pytest.skip("tomllib is Python 3.11+")
    import tomllib
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    declared = set(config["packages"])
    found = {p.parent.relative_to(REPO / "system").as_posix().replace("/", ".")
             for p in (REPO / "system").rglob("__init__.py")}
    found |= {p.parent.relative_to(REPO).as_posix().replace("/", ".") for p in (REPO / "dataset").rglob("__init__.py")}
    assert declared == found
    assert config["package-dir"] == {"": "system", "dataset": "dataset"}
