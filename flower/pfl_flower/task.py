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
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np
from flwr.app import ArrayRecord, Context

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


def project_args(context: Context, repo: Path):
    """The project's parsed and resolved flags (``utils.options``, ``flcore.runner.prepare``) for this run.

    ``-nc`` is ``num-clients``: the dataset must have that many clients (partitions), and the
    embedded Digits dataset is built with that many on first use, as ``system/main.py`` does.
    ``-gr`` is ``num-server-rounds - 1``: main.py trains rounds 0..gr, so both count the same rounds
    (and ``--lag_warmup``'s default, min(gr // 2, 30), is the same).
    """
    from flcore.runner import prepare
    from utils.options import parse_args

    run = context.run_config
    warmup = int(run.get("lag-warmup", -1))
    argv = ["-algo", ALGORITHM, "-data", str(run.get("dataset", "Digits")), "-m", str(run.get("model", "CNN")),
            "-nc", str(run.get("num-clients", 20)), "-gr", str(max(int(run.get("num-server-rounds", 3)) - 1, 0)),
            "-lbs", str(run.get("batch-size", 10)), "-lr", str(run.get("learning-rate", 0.005)),
            "-ls", str(run.get("local-epochs", 1)), "--seed", str(run.get("seed", 0)),
            "-dev", str(setting(context, "device", "cpu")), "-go", str(run.get("goal", "flower")),
            "--data_dir", str(data_dir(context, repo)), "--results_dir", str(results_dir(context, repo)),
            "--lag_top_k", str(run.get("lag-top-k", 2)), "--lag_xi", str(run.get("lag-xi", 0.0)),
            "--lag_schedule", str(run.get("lag-schedule", "every_round")),
            "--lag_granularity", str(run.get("lag-granularity", "tensor"))]
    if warmup >= 0:
        argv += ["--lag_warmup", str(warmup)]
    args, note = prepare(parse_args(argv))
    if note:
        print(f"note: {note}")
    return args


def build_model(args):
    """The global model exactly as ``flcore.runner.build_server`` builds it for ``-algo FedLAG``."""
    from flcore.registry import resolve
    from flcore.runner import build_checked_model
    from flcore.trainmodel.models import split_head
    from utils.data_utils import dataset_info
    from utils.seeding import seed_everything

    seed_everything(args.seed)
    _, spec = resolve(ALGORITHM)
    info = dataset_info(args.dataset, args.num_clients, args.data_dir)
    model = build_checked_model(args.model, info.input_shape, args.num_classes)
    return split_head(model) if spec.head_split else model


# ----- the client on a node ------------------------------------------------------------------------
_DATA: Dict[Tuple, tuple] = {}  # (dataset folder, client id, device) -> (train, test): read once per process


def client_data(args, client_id: int):
    from utils.data_utils import dataset_info, load_client_data

    info = dataset_info(args.dataset, args.num_clients, args.data_dir)
    key = (str(info.root.resolve()), client_id, str(args.device), args.num_classes)
    if key not in _DATA:
        if client_id >= info.num_clients:
            raise SetupError(f"partition-id {client_id} is not a client of {args.dataset} "
                             f"({info.num_clients} clients)")
        _DATA[key] = tuple(load_client_data(info, client_id, split, args.device, num_classes=args.num_classes)
                           for split in ("train", "test"))
    return _DATA[key]


def partition_id(context: Context) -> int:
    value = context.node_config.get("partition-id")
    if value is None:
        raise SetupError("the SuperNode has no partition-id; start it with --node-config 'partition-id=N'")
    return int(value)


def build_client(context: Context):
    """This node's project client (``clientFedLAG``, i.e. FedAvg's local SGD) for its partition."""
    repo = use_project(context)
    from flcore.registry import resolve

    args = project_args(context, repo)
    server_class, _ = resolve(ALGORITHM)
    cid = partition_id(context)
    train, test = client_data(args, cid)
    return server_class.client_class(args, cid, train, test, build_model(args))


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
