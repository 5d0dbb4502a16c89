"""One run of one algorithm: THE round loop, its checkpoints and resume, its results files and the life of
the executor that trains its clients.

The algorithm (a :class:`~flcore.servers.serverbase.Server`) says what happens in a round through its
hooks; :class:`FederatedRun` calls them in order, once per round::

    select_clients -> send_models -> evaluate (every eval_gap) -> train_clients(selected)
    -> receive_models -> aggregate_parameters -> end_round -> drop_uploads

(with ``-dlg``, every ``-dlgg`` rounds, ``remember_payloads`` after ``send_models`` and
``evaluate_leakage`` after ``receive_models``: :mod:`flcore.privacy.leakage`), and around the rounds it
owns what an algorithm author never touches: the run lock and the output checks before round 0, the
progress line and TensorBoard, the executor (``--executor``) for the rounds' duration, auto-break (``-ab``),
checkpoints every ``--checkpoint_every`` rounds and ``--resume``, and the ``.h5`` and CSV (with a fallback
file when the results folder cannot be written).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Dict, Optional, Sequence

import numpy as np
import torch

from app.checkpoints import Checkpoints
from app.config import EXECUTORS, RunConfig
from app.cores import ExecutorChoice, auto_executor, machine_cores
from app.stop_signals import exit_status, signal_of, stop_signals_deferred, stop_signals_raise
from flcore.clients.clientbase import DivergenceError
from flcore.clients.spill_files import StoreError
from flcore.executors.process_pool import ProcessExecutor, draws_global_randomness
from flcore.executors.ray_cluster import RayExecutor
from flcore.executors.sequential import SequentialExecutor
from utils.accuracy_summary import AccuracySummary, summary_from_arrays
from utils.checkpoint import has_checkpoints, remove_checkpoints
from utils.errors import RunError
from utils.memory_release import release_free_memory
from utils.paths import RESULTS_DIR, display_path, portable_config
from utils.progress import RoundReporter
from utils.result_utils import (read_results, result_path, writable_problem, write_results,
                                write_results_fallback)
from utils.run_lock import RunLock, lock_path
from utils.run_table import csv_path, git_revision, write_run_csv
from utils.tensorboard_log import TensorBoardLog, tensorboard_folder


def run_results_file(config: RunConfig, run: int) -> Path:
    """Where run ``run`` of ``config`` writes its .h5 (``--results_dir``, default ``results/``)."""
    folder = Path(config.results_dir) if config.results_dir else RESULTS_DIR
    return result_path(folder, config.dataset, config.algorithm, config.goal, run)


def make_executor(server, config: RunConfig):
    """The executor ``--executor`` names, for ``server``'s clients (``auto``: :mod:`app.cores` decides, and
    the choice is printed)."""
    kind, workers = config.executor, config.workers
    if kind == "auto":
        choice = auto_choice(server, config)
        print(f"clients: {describe_choice(choice)}")
        kind, workers = choice.kind, choice.workers
    if kind == "sequential":
        return SequentialExecutor(keep_gradients=server.upload_needs_gradients())
    if kind == "processes":
        if draws_global_randomness(server.global_model):
            print(f"note: -m {config.model}'s dropout masks come from each worker process's own generator, so "
                  f"results differ from one process's (--executor sequential)")
        return ProcessExecutor(server, workers or machine_cores().free)
    if kind == "ray":
        return RayExecutor(server, workers or 2, config.ray_address, config.gpus_per_worker, config.ray_timeout)
    if kind == "batched":
        from flcore.executors.vmapped import BatchedExecutor  # torch.func only when asked for
        return BatchedExecutor(server, config.batch_clients)
    raise ValueError(f"unknown executor {kind!r}; choose one of {', '.join(EXECUTORS)}")


def auto_choice(server, config: RunConfig) -> ExecutorChoice:
    """``--executor auto`` for ``server``'s run on this machine as it is now."""
    train = [client.train_samples for client in server.clients]
    return auto_executor(machine_cores, server.num_join_clients, sum(train) / len(train) * config.local_epochs,
                         str(server.device), draws_global_randomness(server.global_model), config.workers)


def describe_choice(choice: ExecutorChoice) -> str:
    if choice.kind == "processes":
        return (f"{choice.workers} worker processes, one thread each ({choice.reason}; the same results as "
                f"one process, --executor sequential)")
    return f"one after another in this process ({choice.reason})"


class WriteFailed(RunError):
    """A file of the run could not be written; the message names it, where, and why."""


class RunInterrupted(RunError):
    """A stop signal (Ctrl-C, SIGTERM, SIGHUP) ended the run after its rounds so far were saved;
    ``status`` is what the process exits with, as a shell reports a process that signal ended."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def written(what: str, where: Path, write, *args, **kwargs):
    """``write(*args, **kwargs)``, with an ``OSError`` (no space left, a file-size limit, a folder that is
    gone) turned into :class:`WriteFailed` naming ``what`` and ``where``."""
    try:
        return write(*args, **kwargs)
    except OSError as err:
        raise WriteFailed(f"cannot write {what} in {display_path(where)} ({err.strerror or err})") from None


def between_hooks(server, hook, *args, **kwargs):
    """``hook(*args, **kwargs)``, then every client's working modules parked: a hook may read any client's
    modules, and none is held beyond it (:mod:`flcore.clients.parking`)."""
    result = hook(*args, **kwargs)
    park_clients(server)
    return result


def park_clients(server) -> None:
    """Park every client's working modules; this round's updates move onto the tensors their clients keep."""
    for client in (*server.clients, *server.new_clients):
        if client.needs_parking():
            client.release(server.trained_updates.get(client.id))


def stalled(values: Sequence[float], top_cnt: int) -> bool:
    """Auto-break's test (``-ab``): the best value is more than ``top_cnt`` evaluations old."""
    if len(values) <= top_cnt:
        return False
    return len(values) - 1 - int(np.argmax(values)) > top_cnt


class FederatedRun(Checkpoints):
    """Runs ``server``'s remaining rounds and writes its results (see the module docstring); its
    checkpoints and ``--resume`` are :class:`~app.checkpoints.Checkpoints`'."""

    def __init__(self, server):
        self.server = server
        self.config: RunConfig = server.config
        # Set by resume() from a checkpoint taken after the loop had ended (last round, or -ab): the
        # rounds are over and only finish() and the new-client evaluation remain.
        self.loop_done = False
        # (intended .h5, why it could not be written) once results had to go to a fallback file.
        self.results_fallback: Optional[tuple] = None
        # Checkpoints found under the results name outside its flags' folder, removed when the run completes.
        self.unkeyed_checkpoints: Optional[Path] = None
        # Set by resume() when the results file already holds this run, complete: nothing is run again.
        self.already_complete = False
        # "<csv> (why)" while the CSV beside the results could not be written.
        self.csv_problem: Optional[str] = None

    @property
    def results_file(self) -> Path:
        return run_results_file(self.config, self.server.times)

    # ----- the run ------------------------------------------------------------------------------
    def execute(self) -> None:
        """Run the remaining rounds, then the server's ``finish``, and write the results.

        Before the first round the results name is locked (a second live run with the same name is
        refused) and the checkpoint folder is tried, so an unwritable location stops the run at once.
        A run that ``--resume`` found complete already is left as it is. A stop signal during the rounds
        ends the run with :class:`RunInterrupted`, its rounds so far saved.
        """
        if self.already_complete:
            return
        try:
            lock = RunLock(self.results_file).acquire()
        except OSError as err:
            lock = display_path(lock_path(self.results_file))
            raise WriteFailed(f"--results_dir: cannot write the run's lock {lock} ({err.strerror or err}); free space "
                              f"there or choose a writable folder") from None
        try:
            with stop_signals_raise():  # SIGTERM and SIGHUP stop the loop as Ctrl-C does, keeping the rounds
                self.check_outputs()
                self.run_rounds()
        finally:
            lock.release()

    def check_outputs(self) -> None:
        """Refuse, before round 0, a results file or checkpoint folder that cannot be written."""
        path = self.results_file
        if path.is_dir():
            raise RunError(f"{display_path(path)} is a folder, where this run writes its results file; "
                           f"move it away, or give another -go/--goal or --results_dir")
        if self.config.checkpoint_every:
            problem = writable_problem(self.checkpoint_folder())
            if problem:
                raise RunError(f"--checkpoint_every: cannot write checkpoints to "
                               f"{display_path(self.checkpoint_folder())} ({problem}); choose another "
                               f"--results_dir or run without --checkpoint_every")

    def rounds_left(self) -> range:
        return range(0) if self.loop_done else range(self.server.current_round, self.config.global_rounds + 1)

    def run_rounds(self) -> None:
        """THE round loop (see the module docstring), then ``finish`` and the results."""
        server, config = self.server, self.config
        folder = tensorboard_folder(self.results_file)
        board = (written("TensorBoard's log", folder, TensorBoardLog, folder, server.current_round)
                 if config.tensorboard else None)
        reporter = RoundReporter(len(self.rounds_left()), first=server.current_round,
                                 title=f"{server.algorithm} on {server.dataset}")
        server.executor = make_executor(server, config)
        try:
            for rnd in self.rounds_left():
                server.current_round = rnd
                start = time.perf_counter()
                server.selected_clients = server.select_clients()
                between_hooks(server, server.send_models)
                attacked = server.leakage_due()  # -dlg: the attacker keeps what each client was sent
                if attacked:
                    between_hooks(server, server.remember_payloads)
                summary = between_hooks(server, server.evaluate) if rnd % config.eval_gap == 0 else None
                between_hooks(server, server.train_clients, server.selected_clients)
                if summary is not None and config.eval_after_training:
                    between_hooks(server, server.evaluate, server.selected_clients, prefix="rs_after")
                between_hooks(server, server.receive_models)
                if attacked:  # before aggregation: the uploads as received, the global model as it was sent
                    reporter.note(between_hooks(server, server.evaluate_leakage))
                between_hooks(server, server.aggregate_parameters)
                between_hooks(server, server.end_round, rnd)
                server.drop_uploads()
                release_free_memory()  # the round's freed copies go back to the system (utils/memory_release.py)
                elapsed = time.perf_counter() - start
                server.history["rs_round_time"].append(elapsed)
                reporter.round_done(rnd, elapsed, summary)
                if board is not None:
                    written("TensorBoard's log", board.folder, board.add_round, rnd, server.history)
                # Decided before the checkpoint, which records it: a run killed during finish() and
                # resumed must not train a round past the one -ab stopped at.
                stop = bool(config.auto_break and stalled(server.rs_test_acc, config.top_cnt))
                if config.checkpoint_every and (rnd + 1) % config.checkpoint_every == 0:
                    written("a checkpoint", self.checkpoint_folder(), self.save_checkpoint, rnd,
                            loop_done=stop or rnd == config.global_rounds)
                if stop:
                    reporter.note(f"auto-break: best accuracy unchanged for {config.top_cnt} evaluations")
                    break
            between_hooks(server, server.finish)
            if config.num_new_clients > 0:
                between_hooks(server, server.evaluate_new_clients)
        except DivergenceError as err:
            raise self.stopped(f"{err} (learning rate {config.local_learning_rate}); lower -lr, or check the "
                               f"data") from None
        except WriteFailed as err:  # a full disk, a file-size limit, a folder gone: stop, keeping what is kept
            raise self.stopped(str(err), resumable=True) from None
        except RunError as err:  # e.g. a Ray worker lost for good: stop, keeping the rounds done
            raise self.stopped(str(err)) from None
        except StoreError as err:  # a client's spilled state could not be written or read back
            raise self.stopped(str(err), resumable=err.resumable) from None
        except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM/SIGHUP (app.stop_signals)
            with stop_signals_deferred():  # a second Ctrl-C must not abandon the file being written
                stop = self.stopped(f"stopped by {signal_of(interrupt).name}", resumable=True,
                                    resume_advice="rerun with --resume to continue")
            raise RunInterrupted(str(stop), exit_status(interrupt)) from None
        finally:
            server.state_store.files.close(keep_checkpointed=True)  # the rest goes with the checkpoints
            reporter.close()
            if board is not None:
                try:
                    board.close()
                except OSError:  # said already, or the run ended: the .h5 holds the same series
                    pass
            server.executor.close()
            server.executor = SequentialExecutor()
        with stop_signals_deferred():  # the rounds are over: a stop now must not abandon their file
            path = self.save_results(complete=True)
        if self.results_fallback:
            intended, reason = self.results_fallback
            kept = " (the checkpoints are kept)" if has_checkpoints(self.checkpoint_folder()) else ""
            raise RunError(f"cannot write {display_path(intended)} ({reason}); the complete results were written "
                           f"to {path} instead: move that file there{kept}{self.csv_note()}")
        self.remove_own_checkpoints()
        if self.csv_problem:
            raise RunError(f"cannot write {self.csv_problem}; the complete results are in {display_path(path)}")

    def stopped(self, reason: str, resumable: bool = False,
                resume_advice: str = "free space and rerun with --resume") -> RunError:
        """The one line that ends a run stopped before its end by ``reason``, once its results so far are
        saved (in the results file, or where the fallback put them, marked incomplete). ``resumable``: the
        checkpoints taken before the stop are kept, and the line says so and how to continue
        (``resume_advice``)."""
        path = self.save_results()
        folder = self.checkpoint_folder()
        kept = ""
        if not has_checkpoints(folder):
            try:
                remove_checkpoints(folder)  # nothing but the empty folders a first checkpoint that failed left
            except OSError:
                pass
        elif resumable:
            kept = f"; the checkpoints before it are kept in {display_path(folder)}: {resume_advice}"
        instead = ""
        if self.results_fallback:
            intended, why = self.results_fallback
            instead = f" (not {display_path(intended)}: {why})"
        return RunError(f"round {self.server.current_round}: {reason}. Results so far kept in "
                        f"{display_path(path)}{instead}{self.csv_note()}{kept}")

    def remove_own_checkpoints(self) -> None:
        """Remove this completed run's checkpoints; one that cannot be removed is said, and left."""
        folders = [self.checkpoint_folder()] + ([self.unkeyed_checkpoints] if self.unkeyed_checkpoints else [])
        for folder in folders:
            try:
                remove_checkpoints(folder)
            except OSError as err:
                print(f"note: the run is complete, but its checkpoints in {display_path(folder)} could not be "
                      f"removed ({err.strerror or err}); delete them by hand", file=sys.stderr)

    def csv_note(self) -> str:
        return f" (its CSV could not be written: {self.csv_problem})" if self.csv_problem else ""

    # ----- results ------------------------------------------------------------------------------
    def result_attrs(self) -> Dict[str, object]:
        """The server's own attributes plus what bitwise reproducibility depends on besides the flags:
        the torch build and its thread count."""
        config = dict(portable_config(self.config.flags()), torch_version=torch.__version__,
                      intra_op_threads=torch.get_num_threads())
        return {"config": config, **self.server.result_attrs(), "git_revision": git_revision()}

    def accuracy_summary(self) -> AccuracySummary:
        """Best, final and last-k mean accuracy and the clients' spread at the final evaluation, so far
        (those of the results file when the run was complete already)."""
        history = read_results(self.results_file)[0] if self.already_complete else self.server.history
        return summary_from_arrays(history, self.config.report_last_k)

    def save_results(self, complete: bool = False) -> Path:
        """Write the run's .h5 and return where it went; ``complete`` marks a run that reached its end
        (batch tools skip those).

        When the file cannot be written (a full disk, a folder removed or made read-only during the run)
        the results go to a file in the temporary or home folder instead, and :attr:`results_fallback`
        says why; when nothing can be written, :class:`RunError` says so and where the newest
        checkpoint is.
        """
        path = self.results_file
        # The summary goes with every write, an early stop's too: it describes the evaluations the file holds.
        arrays = self.server.result_arrays()
        attrs = dict(self.result_attrs(), complete=complete, summary=self.accuracy_summary().as_attrs())
        try:
            write_results(path, arrays, attrs)
        except (OSError, RuntimeError) as err:  # h5py reports some write failures as RuntimeError
            reason = getattr(err, "strerror", None) or str(err).splitlines()[0]
        else:
            self._write_csv(path, arrays, attrs)
            return path
        fallback, failures = write_results_fallback(path, arrays, attrs)
        if fallback is None:
            folder = self.checkpoint_folder()
            kept = (f"the newest checkpoint in {display_path(folder)} holds the rounds it saved; free space and "
                    f"rerun with --resume" if has_checkpoints(folder) else "no checkpoint holds them")
            raise RunError(f"cannot write {display_path(path)} ({reason}) nor a copy ({'; '.join(failures)}); "
                           f"{kept}")
        self.results_fallback = (path, reason)
        self._write_csv(fallback, arrays, attrs)
        return fallback

    def _write_csv(self, h5_path: Path, arrays: Dict[str, np.ndarray], attrs: Dict[str, object]) -> None:
        """The run's CSV beside its .h5; one that cannot be written is recorded in :attr:`csv_problem`,
        for the line that ends the run (a CSV written later clears it)."""
        try:
            write_run_csv(h5_path, arrays, attrs)
            self.csv_problem = None
        except OSError as err:
            self.csv_problem = f"{display_path(csv_path(h5_path))} ({err.strerror or err})"
