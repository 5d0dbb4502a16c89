"""Will the run fit? An estimate of the memory a run holds before round 0, checked against what the device
has free, so that a run too large is refused in one line instead of being killed by the kernel (or dying
in an allocator traceback) while its clients are built.

The estimate is a floor: every client holds a copy of the model and its train and test data on the
device, and the server one more copy; methods that keep a second model per client (Ditto, APFL, pFedMe
...) or optimiser state need more.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional

import torch
from torch import nn

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


def needed_bytes(model: nn.Module, info, clients: int) -> int:
    """The floor of what a run of ``clients`` clients holds before round 0: one model per client and the
    server's, and every client's data."""
    return (clients + 1) * model_bytes(model) + data_bytes(info, clients)


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


def memory_problem(model: nn.Module, info, clients: int, device: torch.device, model_name: str) -> Optional[str]:
    """One line saying why the run cannot fit, with what to change; None when it fits or cannot be told."""
    available = available_bytes(device)
    if available is None:
        return None
    need = needed_bytes(model, info, clients)
    if need <= available:
        return None
    return (f"this run needs at least {_size(need)} before round 0 ({clients + 1} copies of {model_name} at "
            f"{_size(model_bytes(model))} each, one per client and the server's, and {_size(data_bytes(info, clients))} "
            f"of client data) and the {device.type} has {_size(available)} free; lower -nc, choose a smaller -m, "
            f"or run where there is more memory")


def _size(count: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"
