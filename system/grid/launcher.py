"""Launching and supervising the planned runs: one ``system/main.py`` process per run, ``-j N`` at once,
each with its own log and, with ``--timeout``, stopped when it runs too long.

Each run is started in a session of its own, so that a Ctrl-C on the terminal reaches the batch only,
not the runs: the batch then stops the running runs with SIGTERM, which makes them count as stopped
rather than failed, and starts no more.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, TextIO, Tuple, Union

from utils.paths import REPO_ROOT
from utils.run_lock import lock_holder

from grid.console import say, warn
from grid.logs import claim_log
from grid.plan import Plan, Run
from grid.settings import Settings
from grid.usage import PROGRAM, PROGRESS

MAIN = f"{REPO_ROOT}/system/main.py"
# Exit statuses as a shell reports them: 124 is coreutils' timeout, 128+N a run ended by signal N.
TIMED_OUT = 124
STOPPED = 128 + signal.SIGTERM
# What became of a run that was not started.
SKIPPED = "skipped"          # its result file is complete
UNBUILT = "dataset"          # its dataset folder could not be built
ELSEWHERE = "elsewhere"      # another live process holds it (its results lock, or its log)
Outcome = Union[int, str]    # an exit status, SKIPPED, UNBUILT or ELSEWHERE; a run never started has none


@dataclass
class Execution:
    outcomes: Dict[int, Outcome] = field(default_factory=dict)  # by index in the plan
    interrupted: bool = False
    elsewhere: Dict[int, str] = field(default_factory=dict)  # by index: who holds each ELSEWHERE run


# Intra-op threads per run unless the user sets OMP_NUM_THREADS (or passes --threads N after --).
RUN_THREADS = 1


def run_environment() -> Dict[str, str]:
    """The environment of every run: OMP_NUM_THREADS = :data:`RUN_THREADS` (one) unless the user set it.

    Not cores / jobs: that count ignores whatever else the machine runs, and an OpenMP thread without a
    free core waits on the others at every operation. Measured on a 2-core machine already running two
    other single-threaded training processes (load about 3): a Digits run (FedAvg, 20 clients) with 2
    threads took 4.5 to 9 times longer per round than with 1 (CNN) and 8 times longer (DNN); two runs at
    once with 2 threads each, 10 to 17 times longer than two runs with 1 thread each. One thread also
    makes every run of a batch compute the same bits whatever ``-j`` and the machine's core count (float
    sums depend on the thread count). Large models on an idle machine may run faster with more: export
    OMP_NUM_THREADS or pass ``-- --threads N``."""
    env = dict(os.environ)
    if not env.get("OMP_NUM_THREADS"):
        env["OMP_NUM_THREADS"] = str(RUN_THREADS)
    return env


def execute(settings: Settings, plan: Plan, states: List[str], unbuilt: Dict[str, str],
            env: Dict[str, str]) -> Execution:
    """Skip complete runs, leave those another live process holds, fail those whose dataset is missing
    (their log is the generator's), run the rest; returns when every started run has ended."""
    pool = RunPool(settings, env)
    execution = Execution()
    with pool.stopped_by_signals():
        for i, run in enumerate(plan.runs):
            if pool.stopping:
                break
            if states[i] == "complete":
                execution.outcomes[i] = SKIPPED
                continue
            log = f"{settings.logs_dir}/{run.log_name}"
            try:
                holder, output = claim_run(run, log)
            except OSError as err:  # the log cannot be opened: this run fails, the others go on
                warn(f"{PROGRAM}: cannot open {log} ({err.strerror or err})")
                execution.outcomes[i] = 1
                continue
            if output is None:
                execution.outcomes[i], execution.elsewhere[i] = ELSEWHERE, holder
                say(f"{PROGRESS} elsewhere {run.name} ({holder}): not started here")
                continue
            if run.data in unbuilt:
                execution.outcomes[i] = UNBUILT
                with output:
                    copy_quietly(unbuilt[run.data], output)
                continue
            if not pool.wait_for_slot():
                output.close()
                break
            note = "" if states[i] == "missing" else f" (existing file {states[i]}: rerun)"
            say(f"{PROGRESS} start  {run.name}{note}")
            if states[i] == "stale":  # the batch asks for these flags: main.py keeps such a file unless told
                run = replace(run, main_flags=(*run.main_flags, "--overwrite"))
            pool.start(i, run, output)
        pool.wait_for_all()
    execution.outcomes.update(pool.exit_codes)
    execution.interrupted = pool.stopping
    return execution


def claim_run(run: Run, log: str) -> Tuple[str, Optional[TextIO]]:
    """(who holds ``run`` when another live process does, its log open for this batch when none does).

    A run is held by the process that holds its results lock (a ``main.py`` started by hand, or by another
    batch) or its log (another batch, from before it starts the run until the run ends): this batch then
    neither starts it nor touches its log. Raises ``OSError`` when the log cannot be opened."""
    held, pid = lock_holder(Path(run.result_file))
    if held:
        return f"being written by {f'process {pid}' if pid else 'another process'}", None
    output = claim_log(log)
    return ("" if output is not None else "its log is held by another batch"), output


def copy_quietly(source: str, output: TextIO) -> None:
    try:
        with open(source, encoding="utf-8", errors="replace") as f:
            shutil.copyfileobj(f, output)
    except OSError:
        pass  # the summary still names the dataset; a missing copy only loses detail


class RunPool:
    """At most ``settings.jobs`` runs at once, one thread waiting on each."""

    def __init__(self, settings: Settings, env: Dict[str, str]):
        self.settings = settings
        self.env = env
        self.timeout = int(settings.timeout) if settings.timeout else None
        self.slots = threading.BoundedSemaphore(settings.jobs)
        # Reentrant: the signal handler takes it on the main thread, which may already hold it.
        self.lock = threading.RLock()
        self.running: Dict[int, subprocess.Popen] = {}
        self.threads: List[threading.Thread] = []
        self.exit_codes: Dict[int, int] = {}
        self.stopping = False

    def wait_for_slot(self) -> bool:
        """Block until fewer than ``jobs`` runs are running; False when the batch is being stopped."""
        self.slots.acquire()
        if self.stopping:
            self.slots.release()
            return False
        return True

    def start(self, index: int, run: Run, output: TextIO) -> None:
        """Start ``run`` on a thread of its own, writing into ``output`` (its claimed log, closed here)."""
        thread = threading.Thread(target=self._run, args=(index, run, output), name=run.name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def wait_for_all(self) -> None:
        for thread in self.threads:
            thread.join()

    @contextmanager
    def stopped_by_signals(self):
        """SIGINT, SIGTERM or SIGHUP stop the batch: no new run starts and running ones get SIGTERM.
        A signal the batch was started ignoring stays ignored, so that ``nohup ./run_all.sh`` survives a
        logout."""
        previous = {}
        if threading.current_thread() is threading.main_thread():  # only there can handlers be set
            for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                if signal.getsignal(number) is not signal.SIG_IGN:
                    previous[number] = signal.signal(number, self._on_signal)
        try:
            yield
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)

    def _on_signal(self, number, frame) -> None:
        self.stopping = True
        with self.lock:
            for process in list(self.running.values()):
                terminate(process)
        try:
            warn(f"{PROGRESS} interrupted; stopping the running jobs")
        except OSError:
            pass  # a hung-up terminal: the runs are stopped all the same

    def _run(self, index: int, run: Run, output: TextIO) -> None:
        log = f"{self.settings.logs_dir}/{run.log_name}"
        started = time.monotonic()
        try:
            code = self._run_logged(index, run, output)
        except OSError as err:  # e.g. the log cannot be written: this run fails, the others go on
            warn(f"{PROGRAM}: {err}")
            code = 1
        finally:
            self.slots.release()
        with self.lock:
            self.running.pop(index, None)
            self.exit_codes[index] = code
        seconds = int(time.monotonic() - started)
        if code == 0:
            say(f"{PROGRESS} done   {run.name} ({seconds} s)")
        elif code == STOPPED:
            say(f"{PROGRESS} stopped {run.name} ({seconds} s)")
        else:
            say(f"{PROGRESS} FAILED {run.name} (exit {code}, {seconds} s, log {log})")

    def _run_logged(self, index: int, run: Run, output: TextIO) -> int:
        command = [sys.executable, MAIN, *run.main_flags]
        with output as f:  # the run's own descriptor keeps the log claimed until it ends
            f.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} {PROGRAM}: {' '.join(command)}\n")
            f.flush()
            process = subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT, env=self.env,
                                       start_new_session=True)
        with self.lock:
            self.running[index] = process
            if self.stopping:  # the signal came between the check before starting and now
                terminate(process)
        return wait(process, self.timeout)


def wait(process: subprocess.Popen, timeout: Optional[int]) -> int:
    """The run's exit status as a shell reports it; :data:`TIMED_OUT` when it ran past ``timeout``."""
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        terminate(process)
        process.wait()
        return TIMED_OUT
    return 128 - code if code < 0 else code


def terminate(process: subprocess.Popen) -> None:
    """SIGTERM to the run and whatever it started (its own process group), as ``timeout`` sends it."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except OSError:
        pass  # it has ended already
