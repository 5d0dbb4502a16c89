"""Give freed memory back to the system (glibc's ``malloc_trim``; nothing elsewhere).

Building thousands of clients, or a round of them, allocates and frees model-sized working copies
between long-lived allocations (each client's data). glibc raises its mmap threshold once a large block
is freed, so later model-sized blocks come from the heap, and freed blocks hemmed in by live ones are
kept by the process: resident memory then grows by about a model per client although nothing is held.
Measured: 300 Ditto clients with MNIST's CNN, 1.31 GB resident after building, 0.71 GB after one trim
(the FedAvg figure), in 0.05 s. Values never change; only what the process keeps mapped.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


def release_free_memory() -> None:
    """Return the heap's free pages to the system, where the C library can (a no-op elsewhere)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
