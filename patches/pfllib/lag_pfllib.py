"""FedLAG inside an upstream PFLlib checkout: the glue between ``flcore/lag`` and PFLlib's main.py.

Installed as ``system/flcore/lag_pfllib.py`` by ``patches/apply_pfllib.py``, which adds one marked
block to ``system/main.py``, just before ``args = parser.parse_args()``::

    from flcore.lag_pfllib import install_lag
    install_lag(parser, globals())

:func:`install_lag` adds the ``--lag_*`` flags to the parser and wraps main.py's ``run(args)``.
``-algo FedLAG`` means FedAvg+LAG; ``-algo X+LAG`` works for any X that main.py's dispatch knows.
For those names the wrapper runs main.py's *own* ``run`` with ``args.algorithm = X``, so X's model
wrapping (BaseHeadSplit or not) and X's server class are upstream's, while the class name that X's
branch instantiates (``server = FedRep(args, i)``) is bound, for the duration of the call, to
``LayerConflictMixin`` + X. Result files and ``average_data`` use the name that was typed
(``Cifar10_FedRep+LAG_test_0.h5``), and the file also holds the mixin's ``lag_*`` arrays.

Only the standard library is imported at import time (``flcore.lag`` and torch come in when a LAG
run starts), so the installer can use :func:`find_dispatch` to check a main.py without torch.
"""
from __future__ import annotations

import ast
import functools
import json
import os
from typing import Callable, Dict, Optional, Tuple

LAG_SUFFIX = "+LAG"
FEDLAG = "FedLAG"          # -algo FedLAG == -algo FedAvg+LAG
FEDLAG_BASE = "FedAvg"

# Upstream algorithms whose uploads are not parameter modules: there is nothing for LAG to rank,
# or the mixin would misread what is uploaded (PFLLIB.md sections 1.4 and 2).
NO_LAG: Dict[str, str] = {
    "Local": "Local shares no parameters",
    "FedProto": "FedProto shares class prototypes, not parameters",
    "FD": "FD shares per-class logits, not parameters",
    "FedPCL": "FedPCL shares prototypes, not parameters",
    "FedGH": "FedGH clients upload prototypes, not parameters",
    "SCAFFOLD": "upstream SCAFFOLD leaves uploaded_models empty (it uploads deltas)",
    "FedFomo": "upstream FedFomo leaves uploaded_models empty and averages on the clients",
    "FedKD": "upstream FedKD uploads compressed numpy dicts, not modules",
    "APPLE": "APPLE has no server-side average",
    "FedAMP": "FedAMP has no server-side average",
    "FedMTL": "FedMTL has no server-side average",
}

class DispatchError(ValueError):
    """main.py's ``run`` cannot be read or has no branch for the requested algorithm."""


# ----- reading main.py's dispatch ---------------------------------------------------------------------
def find_dispatch(source: str) -> Dict[str, Tuple[str, ...]]:
    """``-algo`` name -> dotted path of the class its branch in ``run`` instantiates as ``server``.

    Reads ``if args.algorithm == "FedRep": ... server = FedRep(args, i)`` (also ``elif``, reversed
    comparisons and ``in ("A", "B")``) anywhere inside the module-level function ``run``.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise DispatchError(f"main.py does not parse: {err}") from None
    run = next((node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "run"), None)
    if run is None:
        raise DispatchError("main.py has no module-level function run(args)")
    dispatch: Dict[str, Tuple[str, ...]] = {}
    for node in ast.walk(run):
        if isinstance(node, ast.If):
            names = _algorithm_names(node.test)
            target = _server_class(node.body) if names else None
            for name in names if target else ():
                dispatch.setdefault(name, target)
    if not dispatch:
        raise DispatchError("run(args) in main.py has no `if args.algorithm == \"...\":` branch "
                            "that builds `server = SomeServer(args, i)`")
    return dispatch


def _is_algorithm(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "algorithm"


def _strings(node: ast.AST) -> list:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _algorithm_names(test: ast.AST) -> list:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return []
    left, op, right = test.left, test.ops[0], test.comparators[0]
    if isinstance(op, ast.Eq):
        if _is_algorithm(left):
            return _strings(right)[:1] if isinstance(right, ast.Constant) else []
        if _is_algorithm(right):
            return _strings(left)[:1] if isinstance(left, ast.Constant) else []
    if isinstance(op, ast.In) and _is_algorithm(left):
        return _strings(right)
    return []


def _dotted(node: ast.AST) -> Optional[Tuple[str, ...]]:
    if isinstance(node, ast.Name):
        return (node.id,)
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else head + (node.attr,)
    return None


def _server_class(body) -> Optional[Tuple[str, ...]]:
    for statement in body:
        for node in ast.walk(statement):
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                    and any(isinstance(t, ast.Name) and t.id == "server" for t in node.targets)):
                path = _dotted(node.value.func)
                if path is not None:
                    return path
    return None


def base_algorithm(name: str) -> Optional[str]:
    """The upstream algorithm behind a LAG name (``FedLAG`` -> ``FedAvg``), None for other names."""
    if name == FEDLAG:
        return FEDLAG_BASE
    if name.endswith(LAG_SUFFIX):
        return name[:-len(LAG_SUFFIX)]
    return None


# ----- the server side -------------------------------------------------------------------------------
class UpstreamCompat:
    """Sits between ``LayerConflictMixin`` and an upstream server class (``Mixin, UpstreamCompat, X``).

    * names the run after the typed algorithm (``self.algorithm``), so ``save_results`` writes
      ``<dataset>_<X+LAG>_<goal>_<run>.h5``, and appends the mixin's ``lag_results()`` to that file;
    * after upstream's ``receive_models``, rebuilds ``uploaded_ids`` from parameter identity, one id
      per entry of ``uploaded_models``. Upstream FedRep/FedPer never reset ``uploaded_ids``, so it
      grows every round and no longer lines up with ``uploaded_models`` (the mixin itself finds owners
      by identity; this keeps upstream's own list right for anything else that reads it).
    """

    lag_label: Optional[str] = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.lag_label:
            self.algorithm = self.lag_label

    def receive_models(self):
        super().receive_models()
        owners = self._upload_owner_ids(getattr(self, "uploaded_models", None) or [])
        if owners is not None:
            self.uploaded_ids = owners

    def _upload_owner_ids(self, modules) -> Optional[list]:
        owner = {id(p): client.id for client in self.clients for p in client.model.parameters()}
        ids = []
        for module in modules:
            params = list(module.parameters()) if hasattr(module, "parameters") else []
            found = {owner.get(id(p)) for p in params}
            if len(found) != 1 or None in found:
                return None  # copies or foreign objects: keep upstream's list as it is
            ids.append(found.pop())
        return ids

    def lag_result_path(self) -> str:
        # Upstream's save_results: ../results/<dataset>_<algorithm>_<goal>_<times>.h5 (CWD = system/).
        return os.path.join("..", "results", f"{self.dataset}_{self.algorithm}_{self.goal}_{self.times}.h5")

    def save_results(self):
        super().save_results()
        path = self.lag_result_path()
        if not os.path.exists(path):
            print(f"FedLAG: {path} was not written by save_results(); the lag_* arrays are not saved")
            return
        import dataclasses

        import h5py
        import numpy as np
        with h5py.File(path, "a") as hf:
            for key, value in self.lag_results().items():
                if key in hf:
                    del hf[key]
                if key == "lag_layer_names":
                    hf.create_dataset(key, data=np.array(value, dtype=object), dtype=h5py.string_dtype())
                else:
                    hf.create_dataset(key, data=value.cpu().numpy())
            hf.attrs["lag"] = json.dumps(dataclasses.asdict(self.lag))
        print(f"FedLAG: lag_* arrays added to {path}")


def compose(server_class: type, label: str) -> type:
    """``X+LAG`` for an upstream server class: ``(LayerConflictMixin, UpstreamCompat, X)``."""
    from flcore.lag import with_layer_conflict
    compat = type(f"{server_class.__name__}Upstream", (UpstreamCompat, server_class),
                  {"lag_label": label, "__module__": __name__})
    return with_layer_conflict(compat, label)


# ----- main.py hook ----------------------------------------------------------------------------------
def install_lag(parser, namespace: dict) -> None:
    """Called from main.py's marked block: add the flags and wrap ``namespace['run']``."""
    from flcore.lag.selector import add_lag_arguments  # the project's one definition of the --lag_* flags
    add_lag_arguments(parser.add_argument_group("FedLAG (-algo FedLAG or -algo X+LAG)"))
    run = namespace.get("run")
    if not callable(run):
        raise SystemExit("FedLAG: main.py defines no run(args) function; re-run patches/apply_pfllib.py")
    if getattr(run, "__fedlag_wrapped__", False):
        return
    namespace["run"] = _wrap_run(run, namespace)


def _wrap_run(run: Callable, namespace: dict) -> Callable:
    @functools.wraps(run)
    def run_with_lag(args, *rest, **kwargs):
        label = args.algorithm
        base = base_algorithm(label)
        if base is None:
            return run(args, *rest, **kwargs)
        dispatch = _read_dispatch(label, namespace)
        if label in dispatch:  # main.py has its own branch for this exact name: it wins
            return run(args, *rest, **kwargs)
        holder, attr, original = _plan(label, base, args, dispatch, namespace)
        composed = _composed_class(label, original)
        avg = namespace.get("average_data")
        _set(holder, attr, composed)
        if callable(avg):
            namespace["average_data"] = _renamed(avg, base, label)
        args.algorithm = base
        try:
            return run(args, *rest, **kwargs)
        finally:
            args.algorithm = label
            _set(holder, attr, original)
            if callable(avg):
                namespace["average_data"] = avg
    run_with_lag.__fedlag_wrapped__ = True
    return run_with_lag


def _read_dispatch(label: str, namespace: dict) -> Dict[str, Tuple[str, ...]]:
    try:
        with open(namespace.get("__file__"), encoding="utf-8") as f:
            return find_dispatch(f.read())
    except (OSError, TypeError) as err:
        raise SystemExit(f"-algo {label}: cannot read main.py's dispatch ({err})") from None
    except DispatchError as err:
        raise SystemExit(f"-algo {label}: {err}") from None


def _plan(label: str, base: str, args, dispatch: Dict[str, Tuple[str, ...]], namespace: dict):
    """Checks before any data is read; returns (holder, attribute, class) of X's server class."""
    if base == FEDLAG or base_algorithm(base) is not None:
        raise SystemExit(f"-algo {label}: {base} already is a LAG algorithm")
    if base in NO_LAG:
        raise SystemExit(f"-algo {label} is refused: {NO_LAG[base]}, so there are no layers to personalise")
    from flcore.lag import LagError, LagSettings
    try:
        LagSettings.from_args(args)
    except LagError as err:
        raise SystemExit(f"-algo {label}: {err}") from None
    if base not in dispatch:
        known = [n + LAG_SUFFIX for n in sorted(dispatch) if n not in NO_LAG and base_algorithm(n) is None]
        if FEDLAG_BASE in dispatch:
            known.insert(0, FEDLAG)
        raise SystemExit(f"-algo {label}: main.py's run() has no branch for {base!r}. LAG names: "
                         + ", ".join(known))
    path = dispatch[base]
    try:
        holder: object = namespace
        for part in path[:-1]:
            holder = _get(holder, part)
        original = _get(holder, path[-1])
    except (KeyError, AttributeError):
        raise SystemExit(f"-algo {label}: main.py builds {'.'.join(path)} for {base}, "
                         f"but that name is not defined in main.py") from None
    if not isinstance(original, type):
        raise SystemExit(f"-algo {label}: {'.'.join(path)} is not a class")
    return holder, path[-1], original


def _composed_class(label: str, original: type) -> type:
    if label == FEDLAG:
        from flcore.servers.serverfedlag import FedLAG
        if original in FedLAG.__mro__:
            return FedLAG
    return compose(original, label)


def _get(holder, name):
    return holder[name] if isinstance(holder, dict) else getattr(holder, name)


def _set(holder, name, value) -> None:
    if isinstance(holder, dict):
        holder[name] = value
    else:
        setattr(holder, name, value)


def _renamed(average_data: Callable, base: str, label: str) -> Callable:
    """upstream ``average_data`` reading the files of ``label`` instead of ``base``."""
    @functools.wraps(average_data)
    def average_data_lag(*args, **kwargs):
        if kwargs.get("algorithm") == base:
            kwargs["algorithm"] = label
        elif base in args:
            args = tuple(label if a == base else a for a in args)
        return average_data(*args, **kwargs)
    return average_data_lag
