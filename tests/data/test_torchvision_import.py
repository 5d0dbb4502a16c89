"""A torchvision that cannot be imported (built for another torch, or missing) is one line naming the fix and
exit status 2 from every generator that downloads with it, before anything is written; a ``--source`` build
never imports it."""
import importlib.abc
import importlib.util
import sys
from typing import Optional

import numpy as np
import pytest

from dataset import generate_Digit5
from dataset.utils import torchvision_splits
from dataset.utils.torchvision_splits import OFFLINE_HINT, torchvision_problem
from test_source_files import run_generator

# What a torchvision built for another torch raises on import, by version.
MISMATCHES = {
    "missing-operator": RuntimeError("operator torchvision::nms does not exist"),
    "undefined-symbol": OSError("/site-packages/torchvision/_C.so: undefined symbol: _ZN3c1017RegisterOperators"),
    "import-error": ImportError("/site-packages/torchvision/image.so: undefined symbol: _ZN2at4_ops"),
}


class FailingImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``torchvision`` (and its submodules) before any other finder, and fails to execute it as a
    mismatched build does; with no error, finds nothing, as when it is not installed."""

    def __init__(self, error: Optional[BaseException]):
        self.error = error
        self.asked = []  # the torchvision modules an import looked for

    def find_spec(self, name, path=None, target=None):
        if name != "torchvision" and not name.startswith("torchvision."):
            return None
        self.asked.append(name)
        if self.error is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise self.error


def without_torchvision(monkeypatch, error=None):
    """Make ``import torchvision`` fail with ``error``, or as when it is not installed (``error`` None)."""
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
        monkeypatch.delitem(sys.modules, name)
    finder = FailingImport(error)
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    return finder


def write_source(path, n=60):
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.integers(0, 256, size=(n, 8, 8), dtype=np.uint8), y=np.arange(n) % 10)
    return path


def digit5_folder(tmp_path, domains):
    folder = tmp_path / "digit5"
    folder.mkdir(exist_ok=True)
    for domain in domains:
        write_source(folder / f"{domain}.npz")
    return folder


def build(generator, tmp_path, capsys, source=None):
    """Run ``generator`` into ``tmp_path/data``: (status, output lines, paths written there)."""
    root = tmp_path / "data"
    argv = ["--num-clients", "5", "--root", str(root)] + (["--source", str(source)] if source else [])
    code, out = run_generator(generator, argv, capsys)
    return code, out.strip().splitlines(), sorted(root.rglob("*")) if root.exists() else []


DOWNLOADERS = ["MNIST", "FashionMNIST", "EMNIST", "Cifar10", "Cifar100", "Omniglot", "Digit5"]


@pytest.mark.parametrize("mismatch", sorted(MISMATCHES))
@pytest.mark.parametrize("generator", DOWNLOADERS)
def test_a_torchvision_built_for_another_torch_is_one_line_naming_the_fix(generator, mismatch, tmp_path, capsys,
                                                                         monkeypatch):
    finder = without_torchvision(monkeypatch, MISMATCHES[mismatch])
    # Digit5 downloads only the domains its --source folder lacks; MNIST-M and SynthDigits have no download.
    source = digit5_folder(tmp_path, ["mnistm", "syn"]) if generator == "Digit5" else None
    code, lines, written = build(generator, tmp_path, capsys, source)
    assert code == 2 and len(lines) == 1, lines
    assert finder.asked  # the failure came from the import, not from something before it
    line = lines[0]
    assert line.startswith("error: torchvision ") and "cannot be imported beside torch " in line, line
    assert f"({MISMATCHES[mismatch]})" in line
    assert "install the torchvision built for the installed torch (e.g. pip install torch==" in line
    assert line.endswith(generate_Digit5.OFFLINE_HINT if generator == "Digit5" else OFFLINE_HINT)
    assert "Traceback" not in line and written == []  # not even rawdata/


@pytest.mark.parametrize("generator", ["MNIST", "Omniglot"])
def test_a_missing_torchvision_is_one_line_too(generator, tmp_path, capsys, monkeypatch):
    without_torchvision(monkeypatch)
    code, lines, written = build(generator, tmp_path, capsys)
    assert code == 2 and len(lines) == 1 and written == [], lines
    assert lines[0].startswith("error: torchvision is not installed and this generator downloads with it; "
                               "install it (e.g. pip install torch==") and lines[0].endswith(OFFLINE_HINT)


@pytest.mark.parametrize("generator", DOWNLOADERS)
def test_a_source_build_needs_no_torchvision(generator, tmp_path, capsys, monkeypatch):
    finder = without_torchvision(monkeypatch, MISMATCHES["missing-operator"])
    source = (digit5_folder(tmp_path, generate_Digit5.DOMAINS) if generator == "Digit5"
              else write_source(tmp_path / "source.npz", n=200))
    code, lines, _ = build(generator, tmp_path, capsys, source)
    assert code == 0 and lines[-1].startswith("wrote 5 clients to "), lines
    assert finder.asked == []  # never even looked for


def test_the_line_names_both_versions_what_torchvision_requires_and_torchs_own_index(monkeypatch):
    versions = {"torch": "2.13.0+cpu", "torchvision": "0.28.0"}
    monkeypatch.setattr(torchvision_splits.metadata, "version", versions.__getitem__)
    monkeypatch.setattr(torchvision_splits.metadata, "requires",
                        lambda package: ["numpy", "torch==2.14.0", "pillow!=8.3.*,>=5.3.0"])
    line = torchvision_problem(RuntimeError("operator torchvision::nms does not exist"))
    assert line == ("torchvision 0.28.0, which requires torch==2.14.0, cannot be imported beside torch 2.13.0+cpu "
                    "(operator torchvision::nms does not exist); install the torchvision built for the installed "
                    "torch (e.g. pip install torch==2.13.0+cpu torchvision --index-url "
                    "https://download.pytorch.org/whl/cpu), or build offline with --source FILE.npz, which needs "
                    "no torchvision")
    # A torch from PyPI (no local label) has no index of its own; metadata in the parenthesised form.
    versions["torch"] = "2.13.0"
    monkeypatch.setattr(torchvision_splits.metadata, "requires", lambda package: ["torch (>=2.14.0)"])
    line = torchvision_problem(OSError("undefined symbol"))
    assert "0.28.0, which requires torch>=2.14.0, cannot" in line
    assert "(e.g. pip install torch==2.13.0 torchvision)" in line
