"""What the ServerApp and the ClientApp share: where the project is, its flags, tensors <-> records.

Runs in the ServerApp process (next to the SuperLink) and in every ClientApp process (next to a
SuperNode). Neither imports the project (``flcore``, ``utils``, ``dataset``) at module level: Flower
imports the app before it hands over any configuration, so the project is put on ``sys.path`` by
:func:`use_project` first, and imported inside the functions that need it.

Where the repository is, in this order (the first folder holding ``system/flcore`` wins):
``repo-dir`` in the SuperNode's ``--node-config``, ``repo-dir`` in the run config, the environment
variable ``PFL_REPO``, and the repository this app folder sits in (when Flower runs the app from the
source tree; an installed FAB under ``$FLWR_HOME`` is a copy of ``flower/`` only).
"""
from __future__ import annotations

import io
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Tuple

import numpy as np
from flwr.app import ArrayRecord, Context

if TYPE_CHECKING:  # the project is importable only once use_project() has run
    from utils.flagfields import FlagSpec

REPO_ENV = "PFL_REPO"
ALGORITHM = "FedLAG"  # FedAvg + LAG: the project's registry gives its model layout and client class
# Settings a SuperNode may set for itself (--node-config); they win over the run config.
NODE_KEYS = ("repo-dir", "data-dir", "dump-dir", "device")


class SetupError(RuntimeError):
    """The app cannot find or use the project; the message says what to set."""


# ----- configuration ---------------------------------------------------------------------------------
def setting(context: Context, key: str, default=None):
    """A run setting; for :data:`NODE_KEYS` the node's own ``--node-config`` value comes first."""
    if key in NODE_KEYS and context.node_config.get(key) not in (None, ""):
        return context.node_config[key]
    return context.run_config.get(key, default)


def find_repo(context: Context) -> Path:
    """The repository root (see the module docstring for the search order)."""
    tried: List[str] = []
    candidates = [("node-config repo-dir", context.node_config.get("repo-dir")),
                  ("run-config repo-dir", context.run_config.get("repo-dir")),
                  (f"${REPO_ENV}", os.environ.get(REPO_ENV)),
                  ("this app's folder", str(Path(__file__).resolve().parents[2]))]
    for label, value in candidates:
        if not value:
            continue
        path = Path(str(value)).expanduser().resolve()
        if (path / "system" / "flcore").is_dir():
            return path
        tried.append(f"{label} = {path}")
    raise SetupError("cannot find the pFL repository (a folder with system/flcore); tried "
                     + ("; ".join(tried) or "nothing") + f". Set {REPO_ENV}, or repo-dir in the run "
                     "config (flwr run -c 'repo-dir=\"/path\"') or in the SuperNode's --node-config")


def use_project(context: Context) -> Path:
    """Put the repository's ``system/`` and root on ``sys.path``; return the root."""
    repo = find_repo(context)
    for path in (str(repo), str(repo / "system")):  # system/ ends up first
        if path not in sys.path:
            sys.path.insert(0, path)
    threads = int(context.run_config.get("torch-threads", 0))
    if threads > 0:
        import torch
        torch.set_num_threads(threads)
    return repo


def _folder(context: Context, key: str, repo: Path, default: str) -> Path:
    value = setting(context, key, "")
    return Path(str(value)).expanduser() if value else repo / default


def data_dir(context: Context, repo: Path) -> Path:
    return _folder(context, "data-dir", repo, "dataset")


def results_dir(context: Context, repo: Path) -> Path:
    return _folder(context, "results-dir", repo, "results")


# Where the app's default differs from main.py's: results are tagged "flower", and training uses the CPU
# unless the run config or a SuperNode asks for a device.
APP_DEFAULTS = {"goal": "flower", "device": "cpu"}


def run_keys() -> Dict[str, "FlagSpec"]:
    """Run-config key -> the project flag it sets: every flag whose declaration names a run key
    (``RunConfig`` in ``app/config.py``, ``LagSettings`` in ``flcore/lag/settings.py``)."""
    from app.config import RunConfig
    from utils.flagfields import flag_fields
    return {spec.run_key: spec for _, spec in flag_fields(RunConfig) if spec.run_key}


def run_int(context: Context, key: str, default: int, minimum: int):
    """An integer run-config value of at least ``minimum``; anything else is the project's ConfigError
    naming the key (never argparse's SystemExit, which Flower would record as a completed run)."""
    return _run_number(context, key, default, int, f"an integer >= {minimum}", lambda v: v >= minimum)


def run_fraction(context: Context, key: str, default: float):
    """A run-config number in [0, 1] (see :func:`run_int`)."""
    return _run_number(context, key, default, float, "a number in [0, 1]", lambda v: 0 <= v <= 1)


def _run_number(context: Context, key: str, default, kind, wanted: str, ok):
    from utils.errors import ConfigError
    value = context.run_config.get(key, default)
    number = None
    if not isinstance(value, bool) and isinstance(value, (int, float)) and (kind is float or float(value).is_integer()):
        number = kind(value)
    if number is None or not ok(number):
        raise ConfigError(f"run config: {key} must be {wanted}, got {value!r}; set it in [tool.flwr.app.config] "
                          f"or with flwr run -c '{key}=...'")
    return number


def in_run_config_terms(message: str) -> str:
    """``message`` with the project's flags (``-lr/--local_learning_rate``, ``--lag_top_k``) replaced by
    the run-config keys they come from (``learning-rate``, ``lag-top-k``)."""
    import re

    for key, spec in run_keys().items():
        for spelling in [spec.label, *sorted(spec.names, key=len, reverse=True)]:
            message = re.sub(rf"(?<![\w-]){re.escape(spelling)}(?![\w-])", key, message)
    return message


def project_config(context: Context, repo: Path):
    """The project's ``RunConfig`` for this run: the run-config keys parsed as main.py's flags
    (``app.options``), then resolved (``app.build.prepare``).

    ``-nc`` is ``num-clients``: the dataset must have that many clients (partitions), and the
    embedded Digits dataset is built with that many on first use, as ``system/main.py`` does.
    ``-gr`` is ``num-server-rounds - 1``: main.py trains rounds 0..gr, so both count the same rounds
    (and ``--lag_warmup``'s default, min(gr // 2, 30), is the same). ``-eg`` is ``eval-gap``, so the
    recorded configuration says how often the nodes were evaluated. A key left out takes main.py's
    default, or :data:`APP_DEFAULTS`.

    A value the project refuses raises the project's error (a ``ValueError``, e.g. ``ConfigError``)
    with the run-config key named, e.g. ``lag-top-k must be >= 0``: Flower then records the run as
    failed with that message.
    """
    import contextlib
    from app.build import prepare
    from app.options import parse_args

    run = context.run_config
    rounds = run_int(context, "num-server-rounds", 3, 1)
    warmup = run_int(context, "lag-warmup", -1, -1)  # -1: main.py's default
    keys = run_keys()
    values = {**APP_DEFAULTS, **{key: run[key] for key in keys if key in run}}
    values["device"] = setting(context, "device", APP_DEFAULTS["device"])  # a SuperNode's own comes first
    values["data-dir"], values["results-dir"] = data_dir(context, repo), results_dir(context, repo)
    values.pop("lag-warmup", None)
    if warmup >= 0:
        values["lag-warmup"] = warmup
    argv = ["-algo", ALGORITHM, "-gr", str(rounds - 1), "-eg", str(run_int(context, "eval-gap", 1, 1))]
    for key, value in values.items():
        argv += [f"--{keys[key].dest}", str(value)]
    threads = int(run.get("torch-threads", 0))
    if threads > 0:  # else the project's default: one thread, unless OMP_NUM_THREADS is exported
        argv += ["--threads", str(threads)]
    refused = io.StringIO()
    try:
        with contextlib.redirect_stderr(refused):
            parsed = parse_args(argv)
    except SystemExit:
        # The parser printed "error: <what> (<help hint>)" to stderr; keep <what>, in run-config terms.
        from dataset.utils.one_line import refusal
        from utils.errors import ConfigError
        lines = refused.getvalue().strip().splitlines() or ["invalid value"]
        what = refusal(lines[-1])
        raise ConfigError(f"run config: {in_run_config_terms(what)}; set it in [tool.flwr.app.config] or with "
                          "flwr run -c 'key=value'") from None
    try:
        config, note = prepare(parsed)
    except ValueError as err:  # the project's own errors (ConfigError, DatasetError ...) are ValueErrors
        raise type(err)(f"run config: {in_run_config_terms(str(err))}") from None
    if note:
        print(f"note: {note}")
    return config


def build_model(config):
    """The global model exactly as ``app.build.build_server`` builds it for ``-algo FedLAG``."""
    from flcore.registry import resolve
    from app.build import build_checked_model
    from flcore.trainmodel.models import split_head
    from utils.datasets import dataset_info
    from utils.seeding import seed_everything

    seed_everything(config.seed)
    _, spec = resolve(ALGORITHM)
    info = dataset_info(config.dataset, config.num_clients, config.data_dir)
    model = build_checked_model(config.model, info.input_shape, config.num_classes, config.vocab_size, config.max_len)
    return split_head(model) if spec.head_split else model


# ----- the client on a node ------------------------------------------------------------------------
_DATA: Dict[Tuple, tuple] = {}  # (dataset folder, client id, device) -> (train, test): read once per process


def client_data(config, client_id: int):
    from utils.client_data import load_client_data
    from utils.datasets import dataset_info
    info = dataset_info(config.dataset, config.num_clients, config.data_dir)
    key = (str(info.root.resolve()), client_id, str(config.device), config.num_classes)
    if key not in _DATA:
        if client_id >= info.num_clients:
            raise SetupError(f"partition-id {client_id} is not a client of {config.dataset} "
                             f"({info.num_clients} clients)")
        _DATA[key] = tuple(load_client_data(info, client_id, split, config.device, num_classes=config.num_classes)
                           for split in ("train", "test"))
    return _DATA[key]


def partition_id(context: Context, num_clients: int) -> int:
    """This SuperNode's client id: ``partition-id`` in its ``--node-config``, in 0..num_clients-1."""
    value = context.node_config.get("partition-id")
    if value is None:
        raise SetupError("the SuperNode has no partition-id; start it with --node-config 'partition-id=N'")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < num_clients:
        # A node outside the run's clients would train on data the run never meant to use.
        raise SetupError(f"this SuperNode's partition-id {value!r} is not a client of the run: num-clients is "
                         f"{num_clients}, so partition-id must be an integer in 0..{num_clients - 1}; restart the "
                         "node with another --node-config 'partition-id=N', or raise num-clients in the run config")
    return value


def build_client(context: Context):
    """This node's project client (``clientFedLAG``, i.e. FedAvg's local SGD) for its partition."""
    repo = use_project(context)
    from flcore.registry import resolve
    from app.build import hyperparameters

    config = project_config(context, repo)
    server_class, _ = resolve(ALGORITHM)
    cid = partition_id(context, config.num_clients)
    train, test = client_data(config, cid)
    return server_class.client_class(config, hyperparameters(config), cid, train, test, build_model(config))


# ----- records ------------------------------------------------------------------------------------------
def to_record(tensors: Mapping) -> ArrayRecord:
    return ArrayRecord({name: t.detach().cpu() for name, t in tensors.items()})


def from_record(record: ArrayRecord) -> Dict:
    import torch
    return {name: torch.from_numpy(np.array(array.numpy())) for name, array in record.items()}


def state_to_bytes(state) -> bytes:
    import torch
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def state_from_bytes(data: bytes):
    import torch
    return torch.load(io.BytesIO(data), weights_only=True)


def names_from_config(value: Optional[str]) -> List[str]:
    """Personal tensor names travel as one space-separated string (an empty list is not a valid
    ConfigRecord value)."""
    return str(value or "").split()
