"""The server and THE round loop, written once for every algorithm (template method).

One round (:meth:`Server.train`)::

    select_clients -> send_models -> evaluate (every eval_gap) -> train_clients(selected)
    -> receive_models -> aggregate_parameters -> end_round

An algorithm overrides only the hooks it changes, in the spirit of Flower's ``Strategy``
(``configure_train`` / ``aggregate_train``). Training returns values: ``train_clients`` keeps each
trained client's :class:`~flcore.exchange.ClientUpdate`, ``receive_models`` picks the round's
``uploads`` (after ``-cdr`` drop-out) and their ``upload_weights``, and aggregation reads only those.
PFLlib's names are kept where they mean the same thing (``clients``, ``selected_clients``,
``global_model``, ``rs_test_acc`` ...); its ``uploaded_ids`` / ``uploaded_models`` contract (live
modules of the clients) exists only in the adapter that runs FedLAG inside a PFLlib checkout (``patches/``).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Type

import numpy as np
import torch
from torch import nn

from flcore.aggregation import copy_into, named_tensors, sample_weights, weighted_average
from flcore.algorithm_flags import Hyperparameters
from flcore.clients.clientbase import Client, DivergenceError
from flcore.exchange import ClientUpdate
from flcore.executors import SequentialExecutor, make_executor
from flcore.lag.settings import LagSettings
from flcore.state import StateError, check_attrs, check_value, export_attrs, import_attrs
from utils import progress
from utils.accuracy_summary import AccuracySummary, summary_from_arrays
from utils.checkpoint import (CheckpointError, checkpoint_folder, config_differences, global_rng_state,
                              has_checkpoints, load_latest_checkpoint, other_checkpoint_folders, payload_round,
                              remove_checkpoints, rng_state_problem, save_checkpoint, set_global_rng_state)
from utils.data_utils import DatasetInfo, load_client_splits
from utils.errors import UserError
from utils.metrics import Summary, summarize
from utils.paths import RESULTS_DIR, display_path, portable_config
from utils.progress import RoundReporter
from utils.result_utils import result_path, writable_problem, write_results, write_results_fallback
from utils.run_config import RunConfig
from utils.run_lock import RunLock
from utils.run_table import csv_path, git_revision, write_run_csv
from utils.seeding import sampler_rng
from utils.tensorboard_log import TensorBoardLog, tensorboard_folder


def validation_accuracy(clients: Sequence[Client]) -> float:
    """Sample-weighted accuracy over the clients' validation sets (``--val_ratio``)."""
    stats = [c.test_metrics(c.val_data) for c in clients if c.val_data is not None]
    total = sum(s.num_samples for s in stats)
    return sum(s.correct for s in stats) / total if total else float("nan")


class RunError(UserError, RuntimeError):
    """A run stopped for a reason the user can act on; the message says what to change."""


class ConfigError(UserError, ValueError):
    """Flags that do not fit together, or do not fit the chosen algorithm; the message says which."""


def run_results_file(config: RunConfig, run: int) -> Path:
    """Where run ``run`` of ``config`` writes its .h5 (``--results_dir``, default ``results/``)."""
    folder = Path(config.results_dir) if config.results_dir else RESULTS_DIR
    return result_path(folder, config.dataset, config.algorithm, config.goal, run)


class Server:
    client_class: Type[Client] = Client
    # Server attributes that carry state across rounds (control variates, stored models, ...),
    # besides the global model, the sampler, the round counter and the history.
    persistent_attrs: tuple = ()

    def __init__(self, config: RunConfig, hparams: Hyperparameters, times: int, model: nn.Module,
                 data: DatasetInfo):
        """``config``: this run's flags (seeded for run ``times``); ``hparams``: what the algorithm takes
        (its registry row's dataclass), which its clients receive too. Ends with :meth:`setup`."""
        self.config = config
        self.hparams = hparams
        self.times = times
        self.device = torch.device(config.device)
        self.dataset = config.dataset
        self.algorithm = config.algorithm
        self.goal = config.goal
        self.data_info = data
        self.num_classes = config.num_classes
        self.few_shot = config.few_shot
        self.global_rounds = config.global_rounds
        self.eval_gap = config.eval_gap
        self.num_clients = config.num_clients
        self.join_ratio = config.join_ratio
        self.random_join_ratio = config.random_join_ratio
        self.num_join_clients = max(1, int(config.num_clients * config.join_ratio))
        self.client_drop_rate = config.client_drop_rate
        self.auto_break = config.auto_break
        self.top_cnt = config.top_cnt
        self.num_new_clients = config.num_new_clients
        self.fine_tuning_epoch_new = config.fine_tuning_epoch_new
        self.checkpoint_every = config.checkpoint_every
        self.val_ratio = config.val_ratio
        self.eval_after_training = config.eval_after_training

        self.global_model = model.to(self.device)
        self.sampler = sampler_rng(config.seed)
        self.clients: List[Client] = self.set_clients(range(self.num_clients))
        self.executor = SequentialExecutor()  # replaced for the duration of train() by --executor
        self.new_clients: List[Client] = []
        self.selected_clients: List[Client] = []
        self.trained_updates: Dict[int, ClientUpdate] = {}  # this round's updates, by client id
        self.uploads: List[ClientUpdate] = []               # those that reached the server (-cdr)
        self.upload_weights: List[float] = []

        self.current_round = 0
        # Set by resume() from a checkpoint taken after the loop had ended (last round, or -ab): the
        # rounds are over and only finish() and the new-client evaluation remain.
        self.loop_done = False
        # (intended .h5, why it could not be written) once results had to go to a fallback file.
        self.results_fallback: Optional[tuple] = None
        # A folder of checkpoints in the layout before they were keyed by flags that resume() read.
        self.legacy_checkpoints: Optional[Path] = None
        # Every recorded series, by its name in the .h5 file; algorithms add their own via record().
        self.history: Dict[str, list] = {name: [] for name in ("rs_test_acc", "rs_test_auc", "rs_train_loss",
                                                               "rs_client_acc", "rs_eval_round", "rs_round_time")}
        self._bind_history()
        self.setup()

    def setup(self) -> None:
        """What an algorithm adds once the base server and its clients are built: its hyper-parameters
        as attributes (``self.hparams``), its own state. Overriding ``__init__`` is needed only for work
        that must come first (e.g. wrapping the model)."""

    def _bind_history(self) -> None:
        """PFLlib's attribute names for the three classic series."""
        self.rs_test_acc: List[float] = self.history["rs_test_acc"]
        self.rs_test_auc: List[float] = self.history["rs_test_auc"]
        self.rs_train_loss: List[float] = self.history["rs_train_loss"]

    def lag_settings(self) -> LagSettings:
        """The ``--lag_*`` values, for ``X+LAG`` (:class:`LayerConflictMixin` asks every server for them)."""
        return self.config.lag

    # ----- set-up ------------------------------------------------------------------------------
    def set_clients(self, ids: Sequence[int]) -> List[Client]:
        """Create clients ``ids``; each client's data is read from disk here, once."""
        channels_last = any(p.dim() == 4 and p.is_contiguous(memory_format=torch.channels_last)
                            and not p.is_contiguous() for p in self.global_model.parameters())
        clients = []
        for i in ids:
            train, test, val = load_client_splits(
                self.data_info, i, self.device, num_classes=self.num_classes, few_shot=self.few_shot,
                channels_last=channels_last, val_ratio=self.val_ratio)
            client = self.client_class(self.config, self.hparams, i, train, test, self.global_model)
            client.val_data = val
            clients.append(client)
        return clients

    # ----- the round loop ----------------------------------------------------------------------
    def train(self) -> None:
        """Run the remaining rounds, then :meth:`finish`, and write the results.

        Before the first round the results name is locked (a second live run with the same name is
        refused) and the checkpoint folder is tried, so an unwritable location stops the run at once.
        """
        try:
            lock = RunLock(self.results_file()).acquire()
        except OSError as err:
            raise RunError(f"--results_dir: cannot write to {display_path(self.results_file().parent)} "
                           f"({err.strerror or err}); choose a writable folder") from None
        try:
            self.check_outputs()
            self.run_rounds()
        finally:
            lock.release()

    def check_outputs(self) -> None:
        """Refuse, before round 0, a results file or checkpoint folder that cannot be written."""
        path = self.results_file()
        if path.is_dir():
            raise RunError(f"{display_path(path)} is a folder, where this run writes its results file; "
                           f"move it away, or give another -go/--goal or --results_dir")
        if self.checkpoint_every:
            problem = writable_problem(self.checkpoint_folder())
            if problem:
                raise RunError(f"--checkpoint_every: cannot write checkpoints to "
                               f"{display_path(self.checkpoint_folder())} ({problem}); choose another "
                               f"--results_dir or run without --checkpoint_every")

    def rounds_left(self) -> range:
        return range(0) if self.loop_done else range(self.current_round, self.global_rounds + 1)

    def run_rounds(self) -> None:
        """THE round loop (see the module docstring), then :meth:`finish` and the results."""
        board = (TensorBoardLog(tensorboard_folder(self.results_file()), self.current_round)
                 if self.config.tensorboard else None)
        reporter = RoundReporter(len(self.rounds_left()), first=self.current_round,
                                 title=f"{self.algorithm} on {self.dataset}")
        self.executor = make_executor(self, self.config)
        try:
            for rnd in self.rounds_left():
                self.current_round = rnd
                start = time.perf_counter()
                self.selected_clients = self.select_clients()
                self.send_models()
                summary = self.evaluate() if rnd % self.eval_gap == 0 else None
                self.train_clients(self.selected_clients)
                if summary is not None and self.eval_after_training:
                    self.evaluate(self.selected_clients, prefix="rs_after")
                self.receive_models()
                self.aggregate_parameters()
                self.end_round(rnd)
                elapsed = time.perf_counter() - start
                self.history["rs_round_time"].append(elapsed)
                reporter.round_done(rnd, elapsed, summary)
                if board is not None:
                    board.add_round(rnd, self.history)
                # Decided before the checkpoint, which records it: a run killed during finish() and
                # resumed must not train a round past the one -ab stopped at.
                stop = bool(self.auto_break and self.check_done(self.rs_test_acc, self.top_cnt))
                if self.checkpoint_every and (rnd + 1) % self.checkpoint_every == 0:
                    self.save_checkpoint(rnd, loop_done=stop or rnd == self.global_rounds)
                if stop:
                    reporter.note(f"auto-break: best accuracy unchanged for {self.top_cnt} evaluations")
                    break
            self.finish()
            if self.num_new_clients > 0:
                self.evaluate_new_clients()
        except DivergenceError as err:
            path = self.save_results()
            raise RunError(
                f"round {self.current_round}: {err} (learning rate {self.config.local_learning_rate}); "
                f"lower -lr, or check the data. Results so far kept in {display_path(path)}") from None
        except RunError as err:  # e.g. a Ray worker lost for good: stop, keeping the rounds done
            path = self.save_results()
            raise RunError(f"round {self.current_round}: {err}. Results so far kept in "
                           f"{display_path(path)}") from None
        finally:
            reporter.close()
            if board is not None:
                board.close()
            self.executor.close()
            self.executor = SequentialExecutor()
        path = self.save_results(complete=True)
        if self.results_fallback:
            intended, reason = self.results_fallback
            kept = " (the checkpoints are kept)" if has_checkpoints(self.checkpoint_folder()) else ""
            raise RunError(f"cannot write {display_path(intended)} ({reason}); the complete results were written "
                           f"to {path} instead: move that file there{kept}")
        remove_checkpoints(self.checkpoint_folder())
        if self.legacy_checkpoints is not None:
            remove_checkpoints(self.legacy_checkpoints)

    def select_clients(self) -> List[Client]:
        count = self.num_join_clients
        if self.random_join_ratio:
            count = int(self.sampler.integers(self.num_join_clients, self.num_clients + 1))
        ids = np.sort(self.sampler.choice(self.num_clients, size=count, replace=False))
        return [self.clients[i] for i in ids]

    def global_shared_module(self) -> nn.Module:
        """The part of the global model that clients receive (their :meth:`Client.shared_module`)."""
        return self.global_model.get_submodule(self.client_class.shared_path)

    def broadcast(self) -> Dict[str, torch.Tensor]:
        """What every client receives: the global shared module's tensors, by name (views; each client copies)."""
        return named_tensors(self.global_shared_module())

    def send_models(self) -> None:
        """Every client (selected or not) receives the broadcast, as in PFLlib."""
        shared = self.broadcast()
        for client in self.clients:
            client.set_parameters(shared)

    def train_clients(self, clients: Sequence[Client]) -> None:
        """The one place that decides how selected clients run (``--executor``: in turn, batched, on Ray);
        keeps their updates for :meth:`receive_models`."""
        self.trained_updates = {u.client_id: u for u in self.executor.train(clients)}

    def upload_needs_gradients(self) -> bool:
        """Whether uploads must carry the last minibatch's gradients (FedLAG's ``last_batch`` signal);
        executors that move updates between processes drop them otherwise."""
        return False

    def receive_models(self) -> None:
        """The updates of the selected clients that were not dropped (``-cdr``), and their sample weights."""
        active = self.selected_clients
        if self.client_drop_rate > 0:
            keep = int((1 - self.client_drop_rate) * len(active))
            picks = np.sort(self.sampler.choice(len(active), size=keep, replace=False))
            active = [active[i] for i in picks]
        self.uploads = [self.trained_updates[c.id] for c in active]
        self.upload_weights = sample_weights([u.num_samples for u in self.uploads])

    def uploader_ids(self) -> List[int]:
        """The ids of this round's uploaders, in upload order."""
        return [u.client_id for u in self.uploads]

    def aggregate_parameters(self) -> None:
        """Sample-weighted average of the uploads (parameters and buffers) into the global model."""
        if not self.uploads:
            return
        copy_into(self.global_shared_module(), self.average_uploads())

    def average_uploads(self, weights: Optional[Sequence[float]] = None) -> Dict[str, torch.Tensor]:
        """Average of the uploads' shared tensors by name, weighted by ``weights`` (default: by samples)."""
        weights = self.upload_weights if weights is None else weights
        return weighted_average([u.tensors for u in self.uploads], weights)

    def end_round(self, rnd: int) -> None:
        """Extra per-round server step (after aggregation); nothing by default."""

    def finish(self) -> None:
        """Extra step after the last round (e.g. FedBABU's fine-tuning); nothing by default."""

    # ----- evaluation --------------------------------------------------------------------------
    def evaluate(self, clients: Optional[Sequence[Client]] = None, prefix: str = "rs",
                 model_of: Optional[Callable[[Client], nn.Module]] = None) -> Summary:
        """Sample-weighted test accuracy/AUC over all clients and train loss (PFLLIB.md section 6), of each
        client's :meth:`~Client.evaluation_model` or of ``model_of(client)`` (Ditto's global model)."""
        clients = self.clients if clients is None else clients
        progress.current().begin("evaluate", len(clients))
        results = self.executor.evaluate_clients(clients, model_of)
        summary = summarize([r.test for r in results], [r.train_loss_sum for r in results],
                            [r.train_samples for r in results])
        self.record(f"{prefix}_test_acc", summary.accuracy)
        self.record(f"{prefix}_test_auc", summary.auc)
        self.record(f"{prefix}_train_loss", summary.train_loss)
        if prefix == "rs_after":  # the round's trained clients: which ones changes from round to round
            self.record("rs_after_clients", len(clients))
        else:
            self.record(f"{prefix}_client_acc", summary.client_accuracy)
        if prefix == "rs":
            self.record("rs_eval_round", self.current_round)
            if self.val_ratio > 0:
                self.record("rs_val_acc", validation_accuracy(clients))
        return summary

    def record(self, name: str, value) -> None:
        self.history.setdefault(name, []).append(value)

    def evaluate_new_clients(self) -> Summary:
        """Clients never seen in training (ids -nc .. -nc + -nnc - 1) get what :meth:`receive_new_client`
        gives, fine-tune ``-ften`` epochs their client's way (:meth:`Client.fine_tune`), and are tested."""
        self.new_clients = self.set_clients(range(self.num_clients, self.num_clients + self.num_new_clients))
        for client in self.new_clients:
            self.receive_new_client(client)
        self.fine_tune_clients(self.new_clients, self.fine_tuning_epoch_new, "fine-tune new clients")
        return self.evaluate(self.new_clients, prefix="rs_new")

    def receive_new_client(self, client: Client) -> None:
        """What a new client receives before fine-tuning: the global counterpart of its shared module.
        Methods whose newcomers get something else (nothing, a mean of personal models, server state)
        override this."""
        client.set_parameters(self.broadcast())

    @staticmethod
    def fine_tune_clients(clients: Sequence[Client], epochs: int, stage: str = "fine-tune") -> None:
        """``client.fine_tune(epochs)`` for each client, shown as a stage of the live progress line."""
        progress.current().begin(stage, len(clients))
        for client in clients:
            client.fine_tune(epochs)
            progress.current().advance()

    @staticmethod
    def check_done(values: Sequence[float], top_cnt: int) -> bool:
        """True when the best value is more than ``top_cnt`` evaluations old."""
        if len(values) <= top_cnt:
            return False
        return len(values) - 1 - int(np.argmax(values)) > top_cnt

    # ----- state (checkpoints) -----------------------------------------------------------------
    def state_names(self) -> tuple:
        """The server attributes :meth:`get_state` saves and :meth:`set_state` restores (nothing else)."""
        return ("global_model", "sampler", "current_round", "history") + tuple(self.persistent_attrs)

    def get_state(self) -> dict:
        """Everything needed to continue the run: server attributes and every client's state."""
        state = export_attrs(self, self.state_names())
        state["clients"] = [client.get_state() for client in self.clients]
        return state

    def check_state(self, state: object) -> None:
        """Raise :class:`StateError` unless ``state`` (a :meth:`get_state` output) fits this server: the
        declared attributes only, one state per client, tensors of the live shapes. Changes nothing."""
        if not isinstance(state, dict):
            raise StateError("server: expected a dict of attributes")
        state = dict(state)
        clients = state.pop("clients", None)
        if not isinstance(clients, list) or len(clients) != len(self.clients):
            found = f"{len(clients)}" if isinstance(clients, list) else "none"
            raise StateError(f"server.clients: {len(self.clients)} client states expected, {found} found")
        for client, client_state in zip(self.clients, clients):
            check_attrs(client, client_state, client.state_names(), f"clients[{client.id}]")
        for key, template in self._extra_state().items():
            if key in state:
                saved = state.pop(key)
                if not isinstance(saved, dict) or set(saved) != set(template):
                    raise StateError(f"server.{key}: expected the entries {sorted(template)}")
                check_value(template, saved, f"server.{key}")
        check_attrs(self, state, self.state_names(), "server")

    def _extra_state(self) -> dict:
        """State that a mixin adds to :meth:`get_state` under its own key, with its live value (the
        layer-conflict mixin's selection state, under "lag")."""
        return {"lag": self.lag_state()} if hasattr(self, "lag_state") else {}

    def set_state(self, state: dict) -> None:
        """Load :meth:`get_state`'s output; checked in full first, so a state that does not fit changes nothing."""
        self.check_state(state)
        state = dict(state)
        for client, client_state in zip(self.clients, state.pop("clients")):
            client.set_state(client_state)
        import_attrs(self, state, self.state_names())
        self._bind_history()

    def checkpoint_folder(self) -> Path:
        """This run's checkpoints: under its results name, in a folder of its result-affecting flags."""
        return checkpoint_folder(self.results_file(), self.config.flags())

    def save_checkpoint(self, rnd: int, loop_done: bool = False) -> Path:
        """Everything needed to continue after round ``rnd``, including every random generator.

        ``loop_done``: no round follows (the last round, or -ab stopped the run); a resumed run goes
        straight to :meth:`finish`.
        """
        payload = {"config": self.config.flags(), "server": self.get_state(), "rng": global_rng_state(),
                   "threads": torch.get_num_threads(), "round": rnd, "loop_done": bool(loop_done)}
        return save_checkpoint(self.checkpoint_folder(), rnd, payload)

    def checkpoint_problem(self, payload: dict) -> Optional[str]:
        """Why ``payload`` cannot continue this run, or None; checked before anything is loaded."""
        if not {"config", "server", "rng"} <= set(payload) or not isinstance(payload["config"], dict):
            return "not a checkpoint of this program (no config, server or rng entry)"
        differences = config_differences(payload["config"], self.config.flags())
        if differences:
            return "made with other flags (" + "; ".join(differences) + ")"
        rnd = payload_round(payload)
        if rnd is None:
            return "holds no valid round number (not a checkpoint of this program)"
        if rnd > self.global_rounds:
            return f"its round {rnd} is past -gr {self.global_rounds}"
        threads, loop_done = payload.get("threads"), payload.get("loop_done", False)
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)) \
                or not isinstance(loop_done, bool):
            return "not a checkpoint of this program (threads or loop_done entry of the wrong kind)"
        problem = rng_state_problem(payload["rng"])
        try:
            self.check_state(payload["server"])
        except StateError as err:
            problem = problem or str(err)
        if problem:
            return f"does not fit this run ({problem}); it was not loaded"
        return None

    def resume(self) -> Optional[str]:
        """Continue from the newest usable checkpoint of this run's flags; returns a note for the user.

        Unusable checkpoints (no or wrong checksum, unloadable, not fitting this server) are skipped and
        named; with none usable the run starts from round 0 and says so. Refuses (``CheckpointError``)
        when the only checkpoints under this results name were made with other flags.
        """
        folder = self.checkpoint_folder()
        try:
            found = load_latest_checkpoint(folder, check=self.checkpoint_problem)
        except CheckpointError as err:
            return f"{err}; starting from round 0"
        if found is None:
            found = self._checkpoint_of_other_folders(folder)
            if found is None:
                return "no checkpoint to resume from; starting from round 0"
        try:
            self.set_state(found.payload["server"])
            set_global_rng_state(found.payload["rng"])
        except (StateError, RuntimeError, ValueError, KeyError, TypeError) as err:
            # Past every check, so the server may be half loaded: no other checkpoint can be tried now.
            raise CheckpointError(f"{display_path(found.path)} passed its checks but cannot be loaded "
                                  f"({str(err).splitlines()[0] if str(err) else type(err).__name__}); delete it "
                                  f"and rerun with --resume") from None
        self.current_round = found.round + 1
        self.loop_done = found.payload.get("loop_done", False)
        notes = [f"skipped {s}" for s in found.skipped]
        threads_note = self._match_checkpoint_threads(found.payload.get("threads"))
        if threads_note:
            notes.append(threads_note)
        if found.path is not None and found.path.parent != folder:  # old layout: continue in the new one
            self.legacy_checkpoints = found.path.parent
            notes.append(f"read {display_path(found.path)}")
        done = " (no round left)" if self.loop_done else ""
        return "; ".join(notes + [f"resumed after round {found.round}{done}"])

    def _checkpoint_of_other_folders(self, folder: Path):
        """With no checkpoint of this run's flags: a checkpoint under the same results name in the layout
        from before checkpoints were keyed by flags, if made with the same flags; else refuse, listing
        the differences, when there are checkpoints of other flags; else None."""
        differences: List[str] = []
        blocking: Optional[Path] = None
        for other in other_checkpoint_folders(folder):
            try:
                found = load_latest_checkpoint(other)
            except CheckpointError:
                continue
            config = found.payload.get("config") if isinstance(found.payload, dict) else None
            diff = config_differences(config, self.config.flags()) if isinstance(config, dict) else ["unreadable flags"]
            if not diff and self.checkpoint_problem(found.payload) is None:
                return found
            if blocking is None:
                differences, blocking = diff, other
        if blocking is not None:
            raise CheckpointError(
                f"cannot resume: the checkpoints of {self.results_file().stem} were made with other flags ("
                + "; ".join(differences) + f"); rerun with the original flags, or delete {display_path(blocking)} "
                f"(or run without --resume) to start these flags from round 0")
        return None

    def _match_checkpoint_threads(self, saved: Optional[int]) -> str:
        """Use the checkpoint's intra-op thread count, unless ``--threads`` asks for another one.

        Float sums are split across threads, so the same run under another count differs in the last bits.
        """
        current = torch.get_num_threads()
        if not saved or int(saved) == current:
            return ""
        if not self.config.threads:
            torch.set_num_threads(int(saved))
            return f"using the checkpoint's {int(saved)} intra-op threads (this machine's default is {current})"
        return (f"the checkpoint ran with {int(saved)} intra-op threads and --threads asks for {current}: "
                f"the resumed results will differ from an uninterrupted run in the last bits")

    # ----- results -----------------------------------------------------------------------------
    def result_arrays(self) -> Dict[str, np.ndarray]:
        """Everything saved to the run's .h5; subclasses and mixins extend it."""
        return {name: np.asarray(values) for name, values in self.history.items()}

    def result_attrs(self) -> Dict[str, object]:
        # What bitwise reproducibility depends on besides the flags: the torch build and its thread count.
        config = dict(portable_config(self.config.flags()), torch_version=torch.__version__,
                      intra_op_threads=torch.get_num_threads())
        return {"config": config, "run": self.times, "algorithm": self.algorithm, "dataset": self.dataset,
                "rounds_done": len(self.history["rs_round_time"]), "git_revision": git_revision()}

    def accuracy_summary(self) -> AccuracySummary:
        """Best, final and last-k mean accuracy and the clients' spread at the final evaluation, so far."""
        return summary_from_arrays(self.history, self.config.report_last_k)

    def results_file(self) -> Path:
        return run_results_file(self.config, self.times)

    def save_results(self, complete: bool = False) -> Path:
        """Write the run's .h5 and return where it went; ``complete`` marks a run that reached its end
        (batch tools skip those).

        When the file cannot be written (a full disk, a folder removed or made read-only during the run)
        the results go to a file in the temporary or home folder instead, and :attr:`results_fallback`
        says why; when nothing can be written, :class:`RunError` says so and where the newest
        checkpoint is.
        """
        path = self.results_file()
        # The summary goes with every write, an early stop's too: it describes the evaluations the file holds.
        arrays = self.result_arrays()
        attrs = dict(self.result_attrs(), complete=complete, summary=self.accuracy_summary().as_attrs())
        try:
            write_results(path, arrays, attrs)
            self._write_csv(path, arrays, attrs)
            return path
        except (OSError, RuntimeError) as err:  # h5py reports some write failures as RuntimeError
            reason = getattr(err, "strerror", None) or str(err).splitlines()[0]
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

    @staticmethod
    def _write_csv(h5_path: Path, arrays: Dict[str, np.ndarray], attrs: Dict[str, object]) -> None:
        """The run's CSV beside its .h5; the .h5 is the record, so a CSV that cannot be written is only said."""
        try:
            write_run_csv(h5_path, arrays, attrs)
        except OSError as err:
            print(f"warning: cannot write {display_path(csv_path(h5_path))} ({err.strerror or err}); the results "
                  f"are in {display_path(h5_path)}", file=sys.stderr)
