"""Will the run fit? An estimate of the memory a run holds, checked against what the device has free before
its clients are built, so that a run too large is refused in one line instead of being killed by the
kernel (or dying in an allocator traceback); and the budget of its client-state store.

Clients keep only what is their own (:mod:`flcore.clients.parking`): before round 0 a run holds its
clients' data and a few copies of the model (the server's, the broadcast, the working modules and their
template), whatever the client count. What clients come to own while training (a personal model, a head,
control variates) is held up to ``--state_memory`` and spilled to files beyond it
(:mod:`flcore.clients.state_store`), so it never needs more than that budget: by default (``auto``) a small
share of what is free, see :data:`AUTO_SHARE`.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional, Tuple

import torch
from torch import nn

from utils.paths import display_path
from utils.sizes import format_size, parse_size

# Bytes per stored input value: one-byte codes for images (utils/pixel_codes.py), int64 token ids, float32
# vectors and sensor windows.
BYTES_PER_INPUT = {"image": 1, "tokens": 8}
DEFAULT_BYTES_PER_INPUT = 4


def model_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers."""
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def data_bytes(info, clients: int) -> int:
    """Bytes of the first ``clients`` clients' train and test tensors (inputs and int64 labels)."""
    per_input = math.prod(info.input_shape) * BYTES_PER_INPUT.get(info.input_kind, DEFAULT_BYTES_PER_INPUT)
    samples = sum(info.train_samples[:clients]) + sum(info.test_samples[:clients])
    return samples * (per_input + 8)


# Copies of the model a run holds whatever its client count: the server's, the frozen broadcast, the
# working modules' template and its spares (flcore/clients/parked_modules.py keeps two).
MODEL_COPIES = 5

# ``--state_memory auto`` keeps what clients own in memory up to 1/AUTO_SHARE of what the device has free
# beyond the run's models and data. Clients are drawn at random, so a least-recently-used table holding a
# share f of all clients' state saves only about f of the reads back: at thousands of clients even gigabytes
# save next to none of them and only raise the peak (half of free, the rule before, kept 2.2 GB of ResNet18
# state in memory for Ditto at 10,000 clients). A small table costs one write and one read per client used
# (about 3 s a round for ten ResNet18 clients of Ditto or SCAFFOLD, results/benchmarks/scale/
# default-budget.md), the same whether it is small or large, unless every client fits: a budget that holds
# them all is worth having, so where every client's state surely fits in half of what is free (each client
# at FLOOR_MODELS models' worth, more than any method keeps), auto keeps it all in memory, as 20 Ditto
# clients of ResNet18 want (1.8 GB).
AUTO_SHARE = 64
# ... and never under FLOOR_MODELS models' worth, so that the client read back always fits: the most one
# client owns, among the methods, is about 3.4 models' worth (FedKD; Ditto and SCAFFOLD keep 2, most 1).
FLOOR_MODELS = 4


def needed_bytes(model: nn.Module, info, clients: int) -> int:
    """What a run of ``clients`` clients holds before round 0: :data:`MODEL_COPIES` models and every
    client's data."""
    return MODEL_COPIES * model_bytes(model) + data_bytes(info, clients)


def available_bytes(device: torch.device) -> Optional[int]:
    """Memory free for this process on ``device`` (a CUDA device's free memory; on the CPU the system's
    available memory, or what a container's memory limit leaves, whichever is smaller); None when it
    cannot be told."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    found = [value for value in (_meminfo_available(), _cgroup_available()) if value is not None]
    return min(found) if found else None


def _meminfo_available() -> Optional[int]:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_available() -> Optional[int]:
    """What a cgroup v2 memory limit leaves (``memory.max`` less ``memory.current``), if there is one."""
    root = Path("/sys/fs/cgroup")
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(int(limit) - int((root / "memory.current").read_text().strip()), 0)
    except (OSError, ValueError):
        return None


def memory_problem(model: nn.Module, info, clients: int, device: torch.device, model_name: str,
                   state_memory: str = "auto") -> Optional[str]:
    """One line saying why the run cannot fit, with what to change; None when it fits or cannot be told."""
    available = available_bytes(device)
    if available is None:
        return None
    need = needed_bytes(model, info, clients)
    if need > available:
        return (f"this run needs at least {format_size(need)} before round 0 ({MODEL_COPIES} copies of "
                f"{model_name} at {format_size(model_bytes(model))} each and {format_size(data_bytes(info, clients))} "
                f"of client data) and the {device.type} has {format_size(available)} free; lower -nc, choose a "
                f"smaller -m, or run where there is more memory")
    if state_memory != "auto" and need + parse_size(state_memory) > available:
        return (f"--state_memory {state_memory} and the run's models and data ({format_size(need)}) exceed the "
                f"{format_size(available)} the {device.type} has free; lower --state_memory (the clients' state "
                f"beyond it goes to files), or lower -nc")
    floor = FLOOR_MODELS * model_bytes(model)  # what auto keeps at the least (its share is of what is left)
    if state_memory == "auto" and need + floor > available:
        return (f"the run's models and data ({format_size(need)}) and the least memory kept for the clients' own "
                f"state ({FLOOR_MODELS} copies of {model_name}, {format_size(floor)}) exceed the "
                f"{format_size(available)} the {device.type} has free; lower -nc, choose a smaller -m, or run "
                f"where there is more memory")
    return None


def state_budget(model: nn.Module, info, clients: int, device: torch.device, state_memory: str) -> Optional[int]:
    """Bytes of own client state kept in memory (None: no limit), see :func:`chosen_state_budget`."""
    return chosen_state_budget(model, info, clients, device, state_memory)[0]


def chosen_state_budget(model: nn.Module, info, clients: int, device: torch.device,
                        state_memory: str) -> Tuple[Optional[int], str]:
    """The bytes of own client state kept in memory and how they were chosen, in words for the run's opening
    line: ``--state_memory`` as given, or for ``auto`` half of what the device has free beyond the models
    and data where every client's state fits there at :data:`FLOOR_MODELS` models' worth each, else
    1/:data:`AUTO_SHARE` of it, never under :data:`FLOOR_MODELS` models' worth (None, no limit, when what
    is free cannot be told)."""
    if state_memory != "auto":
        return parse_size(state_memory), f"--state_memory {state_memory}"
    available = available_bytes(device)
    if available is None:
        return None, f"auto: what the {device.type} has free cannot be told"
    left = max(available - needed_bytes(model, info, clients), 0)
    share, floor = left // AUTO_SHARE, FLOOR_MODELS * model_bytes(model)
    if clients * floor <= left // 2:
        return left // 2, (f"auto: every client's state fits in half of the {format_size(left)} the "
                           f"{device.type} has free beyond models and data")
    if share >= floor:
        return share, (f"auto: 1/{AUTO_SHARE} of the {format_size(left)} the {device.type} has free beyond "
                       f"models and data")
    return floor, (f"auto: {FLOOR_MODELS} models' worth, the least it keeps, over 1/{AUTO_SHARE} of the "
                   f"{format_size(left)} the {device.type} has free beyond models and data")


def state_memory_line(budget: Optional[int], how: str, folder: Path) -> str:
    """The run's opening line on its clients' own state: where it is kept, and up to how much in memory."""
    if budget is None:
        return f"client state: all in memory ({how})"
    return (f"client state: up to {format_size(budget)} in memory ({how}), beyond it in files under "
            f"{display_path(folder)}")
