"""From parsed flags to a ready server: device, dataset, model, seeds (no global state mutated)."""
from __future__ import annotations

import argparse
import copy

import torch

from flcore.registry import resolve
from flcore.servers.serverbase import ConfigError
from flcore.trainmodel.models import build_model, split_head
from utils.data_utils import DatasetError, dataset_info, ensure_default_dataset
from utils.seeding import seed_everything


class DeviceError(ValueError):
    pass


def resolve_device(requested: str, device_id: str = "0") -> tuple[str, str]:
    """(device, note): ``cuda`` falls back to ``cpu`` when no GPU is visible, as in PFLlib."""
    if requested == "cpu":
        return "cpu", ""
    if requested == "cuda" or requested.startswith("cuda:"):
        if not torch.cuda.is_available():
            return "cpu", "CUDA is not available; running on the CPU"
        return (requested if ":" in requested else f"cuda:{device_id.split(',')[0]}"), ""
    if requested == "mps":
        if not torch.backends.mps.is_available():
            return "cpu", "MPS is not available; running on the CPU"
        return "mps", ""
    raise DeviceError(f"unknown device {requested!r}; use cpu, cuda, cuda:N or mps")


def prepare(args: argparse.Namespace) -> tuple[argparse.Namespace, str]:
    """Resolve what the flags leave open, on a copy: device, class count, LAG warm-up length.

    Also checks the algorithm name early and builds the embedded dataset on first use.
    """
    resolved = copy.copy(args)
    resolved.device, note = resolve_device(args.device, args.device_id)
    resolve(args.algorithm)
    ensure_default_dataset(args.dataset, args.num_clients + args.num_new_clients, args.data_dir)
    info = dataset_info(args.dataset, args.num_clients + args.num_new_clients, args.data_dir)
    if resolved.num_classes is None:
        resolved.num_classes = info.num_classes
    elif resolved.num_classes < info.num_classes:
        raise DatasetError(f"-ncl {resolved.num_classes} is below the {info.num_classes} classes of "
                           f"{args.dataset}; omit -ncl to use the dataset's count")
    if resolved.lag_warmup is None:
        resolved.lag_warmup = min(args.global_rounds // 2, 30)
    return resolved, note


def build_server(args: argparse.Namespace, run: int = 0):
    """Seed run ``run`` with ``seed + run`` and build its server (model, clients and their data)."""
    run_args = copy.copy(args)
    run_args.seed = args.seed + run
    seed_everything(run_args.seed)
    server_class, spec = resolve(args.algorithm)
    info = dataset_info(args.dataset, args.num_clients + args.num_new_clients, args.data_dir)
    model = build_checked_model(args.model, info.input_shape, args.num_classes)
    if spec.head_split:
        model = split_head(model)
    server = server_class(run_args, run, model, info)
    if args.resume:
        note = server.resume()
        if note:
            print(f"note: {note}")
    return server


def build_checked_model(name: str, input_shape, num_classes: int):
    """Build ``-m name`` and push a dummy batch through it, so a model that cannot take the dataset's
    inputs (e.g. an image too small for its pooling) fails early, in one line."""
    try:
        model = build_model(name, input_shape, num_classes)
        model.eval()
        with torch.no_grad():
            model(torch.zeros(2, *input_shape))
        model.train()
        return model
    except RuntimeError as err:
        first_line = str(err).splitlines()[0]
        raise ConfigError(f"model {name} cannot take inputs of shape {tuple(input_shape)} ({first_line}); "
                          f"choose another -m") from None
