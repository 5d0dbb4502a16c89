"""Imports point one way: ``utils`` and ``dataset`` (helpers) below ``flcore`` (the algorithms) below ``app``
(configuration, command line, the run) below ``grid`` and ``reporting``; and no two modules import each
other, directly or round a circle. Every import counts, a function-level one too (it still makes the
module depend on the other); only ``if TYPE_CHECKING:`` blocks are left out.

The same check from the command line: ``python -m pytest -q -n 0 tests/runs/test_import_layers.py -rA``.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

from helpers import REPO

# package -> layer; a module may import its own layer or those below.
LAYERS = {"utils": 0, "dataset": 0, "flcore": 1, "app": 2, "grid": 3, "reporting": 3}
FOLDERS = {"utils": REPO / "system" / "utils", "flcore": REPO / "system" / "flcore", "app": REPO / "system" / "app",
           "grid": REPO / "system" / "grid", "reporting": REPO / "system" / "reporting",
           "dataset": REPO / "dataset"}


def project_modules() -> Dict[str, Path]:
    modules = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            parts = (package,) + path.relative_to(folder).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: Dict[str, Path]) -> Set[str]:
    """The project modules that ``name`` imports anywhere in its file (outside ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    hidden = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
              for n in ast.walk(block)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def known(target: str) -> str:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target

    found: Set[str] = set()
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            found |= {known(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parents = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parents + ([node.module] if node.module else []))
            found |= {known(f"{base}.{alias.name}") or known(base) for alias in node.names}
    return {m for m in found if m and m != name}


def import_graph() -> Dict[str, Set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_a_layer_above_its_own():
    graph = import_graph()
    upward = sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                    if LAYERS[b.split(".")[0]] > LAYERS[a.split(".")[0]])
    assert upward == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_check_sees_function_level_imports_and_cycles(tmp_path):
    """The checker itself: an import inside a function is an edge, a TYPE_CHECKING one is not, and a
    circle of three modules is one cycle."""
    files = {"utils/a.py": "def f():\n    from flcore import b\n",
             "flcore/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from app import c\nimport flcore.c\n",
             "flcore/c.py": "from utils import a\n"}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    modules = {rel[:-3].replace("/", "."): tmp_path / rel for rel in files}
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert graph == {"utils.a": {"flcore.b"}, "flcore.b": {"flcore.c"}, "flcore.c": {"utils.a"}}
    assert cycles(graph) == [["flcore.b", "flcore.c", "utils.a"]]
