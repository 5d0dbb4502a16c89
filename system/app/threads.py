"""How many intra-op threads a run uses: ``--threads N`` when given, the count the environment exports
(OMP_NUM_THREADS, MKL_NUM_THREADS, which torch reads at start) when set, else one.

One, not torch's default of one per core: the models and batches this project runs (PFLlib's batch of
10, CNNs to ResNet18 and a Transformer) gave nothing to a second thread, and beside other busy processes
every extra thread waits for a free core at each operation (``benchmarks/threads.py``; the figures are in
``results/benchmarks/threads/``). One count everywhere also gives the same bits on machines with any
number of cores, since float sums depend on the thread count. The count used is recorded in each
``.h5`` (``intra_op_threads``).
"""
from __future__ import annotations

from typing import Mapping, Optional

DEFAULT_THREADS = 1
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def run_threads(requested: int, environ: Mapping[str, str]) -> Optional[int]:
    """The count to set for ``--threads requested`` (0: left out) under ``environ``; None keeps the count
    torch took from an exported variable."""
    if requested:
        return requested
    if any(environ.get(name, "").strip() for name in THREAD_VARIABLES):
        return None
    return DEFAULT_THREADS
