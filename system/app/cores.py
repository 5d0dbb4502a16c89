"""How many of this machine's cores are free when a run starts, and what ``--executor auto`` (the default)
makes of it: worker processes for the clients where they pay, one process where they cannot.

Free cores are the cores this process may use (its CPU affinity, capped by a container's CPU quota) that
are idle now: sampled from ``/proc/stat`` over a fifth of a second, since the load average trails the
machine by a minute. Beside two busy processes per core no core is idle, and the run stays in one
process, as fast as it ever was there (``results/benchmarks/threads/``).

Threads stay at one per process whatever is free: a second worker pays more than a second thread (on
MNIST / CNN on a free 2-core machine, 2.28x against 1.52x a round), and one thread per process gives the
same bits on every machine, whatever its load when the run started.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Tuple

# A client must train on at least this many samples a round for a worker process to pay for shipping it
# there and back (benchmarks/process_pool.py on a free 2-core machine: the quickstart's clients of 17-67
# images ran no faster on two workers than in one process, 1.01x; MNIST's 20 clients of about 2,600 ran
# 2.28x faster).
MIN_SAMPLES_PER_CLIENT = 200
# An idle fraction of a core this large counts as a free core (a core idle three quarters of the time
# mostly waits for this run).
IDLE_ROUNDING = 0.25
SAMPLE_SECONDS = 0.2


def usable_cores() -> int:
    """Cores this process may run on: its affinity, capped by a cgroup v2 CPU quota when there is one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cgroup_quota()
    return max(1, min(cores, math.floor(quota))) if quota is not None else max(1, cores)


def _cgroup_quota() -> Optional[float]:
    """Cores a cgroup v2 ``cpu.max`` allows (quota / period), or None without a limit."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _cpu_times() -> Optional[Tuple[int, int, int]]:
    """(idle jiffies, all jiffies, cpus) from ``/proc/stat``, or None where there is none."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
        fields = [int(value) for value in lines[0].split()[1:]]
        cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
    return idle, sum(fields[:8]), cpus  # guest time is inside user time already


def idle_cores(seconds: float = SAMPLE_SECONDS) -> Optional[float]:
    """Cores idle over the next ``seconds`` (a fraction), or None where the kernel does not say."""
    first = _cpu_times()
    time.sleep(seconds)
    second = _cpu_times()
    if first is None or second is None or second[1] <= first[1]:
        return None
    return (second[0] - first[0]) / (second[1] - first[1]) * second[2]


@dataclass(frozen=True)
class Cores:
    usable: int
    idle: Optional[float]

    @property
    def free(self) -> int:
        """Usable cores that are idle (all usable ones where idleness cannot be told)."""
        if self.idle is None:
            return self.usable
        return max(1, min(self.usable, math.floor(self.idle + IDLE_ROUNDING)))

    def describe(self) -> str:
        idle = "" if self.idle is None else f", {self.idle:.1f} idle"
        return f"{self.free} of {self.usable} cores free{idle}"


def machine_cores() -> Cores:
    return Cores(usable_cores(), idle_cores())


@dataclass(frozen=True)
class ExecutorChoice:
    kind: str      # "sequential" or "processes"
    workers: int
    reason: str


def auto_executor(cores: Callable[[], Cores], clients_per_round: int, samples_per_client: float, device: str,
                  global_randomness: bool, workers: int = 0) -> ExecutorChoice:
    """``--executor auto``'s choice: worker processes, as many as free cores (or ``--workers``) and
    clients per round allow, unless they cannot pay or cannot give the sequential run's bits. ``cores``
    is asked last (it watches the machine for a moment), only when nothing else decides."""
    def one_process(why: str) -> ExecutorChoice:
        return ExecutorChoice("sequential", 1, why)

    if device != "cpu":
        return one_process(f"on {device} the clients train in turn")
    if workers == 1:
        return one_process("--workers 1")
    if clients_per_round < 2:
        return one_process("one client trains per round")
    if global_randomness:
        return one_process("the model's dropout draws from torch's global generator, which other processes "
                           "do not share")
    if samples_per_client < MIN_SAMPLES_PER_CLIENT:
        return one_process(f"clients of {samples_per_client:.0f} samples a round are too small to gain from "
                           f"other processes")
    if workers:
        return ExecutorChoice("processes", min(workers, clients_per_round), f"--workers {workers}")
    found = cores()
    if found.free < 2:
        return one_process(found.describe())
    return ExecutorChoice("processes", min(found.free, clients_per_round), found.describe())
