"""The benchmarks' runner: jobs through a pool of threads (each job starts its own ``main.py`` process), one
printed line per job as it finishes, in the order given."""
from __future__ import annotations

import concurrent.futures
from typing import Callable, Iterable


def run_jobs(run_one: Callable[[object], str], jobs: Iterable, workers: int) -> None:
    """``run_one(job)`` for every job, ``workers`` at a time, printing what each returns."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        for message in pool.map(run_one, jobs):
            print(message, flush=True)
