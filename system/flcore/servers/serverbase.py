"""The server and THE round loop, written once for every algorithm (template method).

One round (:meth:`Server.train`)::

    select_clients -> send_models -> evaluate (every eval_gap) -> train_clients(selected)
    -> receive_models -> aggregate_parameters -> end_round

An algorithm overrides only the hooks it changes, in the spirit of Flower's ``Strategy``
(``configure_train`` / ``aggregate_train``). PFLlib's attribute names and contracts are kept:
``clients``, ``selected_clients``, ``global_model``, ``uploaded_ids`` / ``uploaded_weights`` /
``uploaded_models`` (live references to each client's shared module), ``rs_test_acc`` ... so that
code written against PFLlib, and :class:`LayerConflictMixin`, work on these servers unchanged.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Type

import numpy as np
import torch
from torch import nn

from flcore.aggregation import copy_into, named_tensors, sample_weights, weighted_average
from flcore.clients.clientbase import Client, DivergenceError
from flcore.executors import SequentialExecutor, make_executor
from flcore.state import export_attrs, import_attrs
from utils.checkpoint import (CheckpointError, checkpoint_folder, config_differences, global_rng_state,
                              load_latest_checkpoint, remove_checkpoints, save_checkpoint, set_global_rng_state)
from utils.data_utils import DatasetError, DatasetInfo, load_client_data
from utils.metrics import Summary, summarize
from utils.paths import RESULTS_DIR, display_path, portable_config
from utils.progress import RoundReporter
from utils.result_utils import result_path, write_results
from utils.seeding import sampler_rng


class RunError(RuntimeError):
    """A run stopped for a reason the user can act on; the message says what to change."""


class ConfigError(ValueError):
    """Flags that do not fit together, or do not fit the chosen algorithm; the message says which."""


def require(*checks: tuple) -> None:
    """Raise one ConfigError listing every ``(condition, message)`` pair whose condition is false."""
    problems = [message for ok, message in checks if not ok]
    if problems:
        raise ConfigError("; ".join(problems))


class Server:
    client_class: Type[Client] = Client
    # Server attributes that carry state across rounds (control variates, stored models, ...),
    # besides the global model, the sampler, the round counter and the history.
    persistent_attrs: tuple = ()

    def __init__(self, args, times: int, model: nn.Module, data: DatasetInfo):
        self.args = args
        self.times = times
        self.device = torch.device(args.device)
        self.dataset = args.dataset
        self.algorithm = args.algorithm
        self.goal = args.goal
        self.data_info = data
        self.global_rounds = args.global_rounds
        self.eval_gap = args.eval_gap
        self.num_clients = args.num_clients
        self.join_ratio = args.join_ratio
        self.random_join_ratio = args.random_join_ratio
        self.num_join_clients = max(1, int(args.num_clients * args.join_ratio))
        self.client_drop_rate = args.client_drop_rate
        self.auto_break = args.auto_break
        self.top_cnt = args.top_cnt
        self.num_new_clients = args.num_new_clients
        self.fine_tuning_epoch_new = args.fine_tuning_epoch_new
        self.checkpoint_every = getattr(args, "checkpoint_every", 0)

        self.global_model = model.to(self.device)
        self.sampler = sampler_rng(args.seed)
        self.clients: List[Client] = self.set_clients(range(self.num_clients))
        self.executor = SequentialExecutor()  # replaced for the duration of train() by --executor
        self.new_clients: List[Client] = []
        self.selected_clients: List[Client] = []
        self.uploaded_ids: List[int] = []
        self.uploaded_weights: List[float] = []
        self.uploaded_models: List[nn.Module] = []

        self.current_round = 0
        # Every recorded series, by its name in the .h5 file; algorithms add their own via record().
        self.history: Dict[str, list] = {name: [] for name in ("rs_test_acc", "rs_test_auc", "rs_train_loss",
                                                               "rs_client_acc", "rs_eval_round", "rs_round_time")}
        self._bind_history()

    def _bind_history(self) -> None:
        """PFLlib's attribute names for the three classic series."""
        self.rs_test_acc: List[float] = self.history["rs_test_acc"]
        self.rs_test_auc: List[float] = self.history["rs_test_auc"]
        self.rs_train_loss: List[float] = self.history["rs_train_loss"]

    # ----- set-up ------------------------------------------------------------------------------
    def set_clients(self, ids: Sequence[int]) -> List[Client]:
        """Create clients ``ids``; each client's data is read from disk here, once."""
        channels_last = any(p.dim() == 4 and p.is_contiguous(memory_format=torch.channels_last)
                            and not p.is_contiguous() for p in self.global_model.parameters())
        clients = []
        for i in ids:
            train = load_client_data(self.data_info, i, "train", self.device, num_classes=self.args.num_classes,
                                     few_shot=self.args.few_shot, channels_last=channels_last)
            test = load_client_data(self.data_info, i, "test", self.device, num_classes=self.args.num_classes,
                                    channels_last=channels_last)
            if len(train) == 0 or len(test) == 0:
                raise DatasetError(f"client {i} of {self.dataset} has {len(train)} train and {len(test)} "
                                   f"test samples; every client needs at least one of each")
            clients.append(self.client_class(self.args, i, train, test, self.global_model))
        return clients

    # ----- the round loop ----------------------------------------------------------------------
    def train(self) -> None:
        reporter = RoundReporter(self.global_rounds + 1 - self.current_round, first=self.current_round,
                                 title=f"{self.algorithm} on {self.dataset}")
        self.executor = make_executor(self, self.args)
        try:
            for rnd in range(self.current_round, self.global_rounds + 1):
                self.current_round = rnd
                start = time.perf_counter()
                self.selected_clients = self.select_clients()
                self.send_models()
                summary = self.evaluate() if rnd % self.eval_gap == 0 else None
                self.train_clients(self.selected_clients)
                self.receive_models()
                self.aggregate_parameters()
                self.end_round(rnd)
                elapsed = time.perf_counter() - start
                self.history["rs_round_time"].append(elapsed)
                reporter.round_done(rnd, elapsed, summary)
                if self.checkpoint_every and (rnd + 1) % self.checkpoint_every == 0:
                    self.save_checkpoint(rnd)
                if self.auto_break and self.check_done(self.rs_test_acc, self.top_cnt):
                    reporter.note(f"auto-break: best accuracy unchanged for {self.top_cnt} evaluations")
                    break
            self.finish()
            if self.num_new_clients > 0:
                self.evaluate_new_clients()
        except DivergenceError as err:
            path = self.save_results()
            raise RunError(
                f"round {self.current_round}: {err} (learning rate {self.args.local_learning_rate}); "
                f"lower -lr, or check the data. Results so far kept in {display_path(path)}") from None
        finally:
            reporter.close()
            self.executor.close()
            self.executor = SequentialExecutor()
        self.save_results(complete=True)
        remove_checkpoints(self.checkpoint_folder())

    def select_clients(self) -> List[Client]:
        count = self.num_join_clients
        if self.random_join_ratio:
            count = int(self.sampler.integers(self.num_join_clients, self.num_clients + 1))
        ids = np.sort(self.sampler.choice(self.num_clients, size=count, replace=False))
        return [self.clients[i] for i in ids]

    def global_shared_module(self) -> nn.Module:
        """The part of the global model that clients receive (their :meth:`Client.shared_module`)."""
        return self.global_model.get_submodule(self.client_class.shared_path)

    def send_models(self) -> None:
        """Every client (selected or not) receives the global model, as in PFLlib."""
        shared = self.global_shared_module()
        for client in self.clients:
            client.set_parameters(shared)

    def train_clients(self, clients: Sequence[Client]) -> None:
        """The one place that decides how selected clients run (``--executor``: in turn, or on Ray)."""
        self.executor.train(clients)

    def receive_models(self) -> None:
        """Collect the shared modules of the selected clients that were not dropped (``-cdr``)."""
        active = self.selected_clients
        if self.client_drop_rate > 0:
            keep = int((1 - self.client_drop_rate) * len(active))
            picks = np.sort(self.sampler.choice(len(active), size=keep, replace=False))
            active = [active[i] for i in picks]
        self.uploaded_ids = [c.id for c in active]
        self.uploaded_weights = sample_weights([c.train_samples for c in active])
        self.uploaded_models = [c.shared_module() for c in active]

    def aggregate_parameters(self) -> None:
        """Sample-weighted average of the uploads (parameters and buffers) into the global model."""
        if not self.uploaded_models:
            return
        copy_into(self.global_shared_module(), self.average_uploads())

    def average_uploads(self, weights: Optional[Sequence[float]] = None) -> Dict[str, torch.Tensor]:
        """Average of the uploads' shared tensors by name, weighted by ``weights`` (default: by samples)."""
        names = [n for n in named_tensors(self.uploaded_models[0]) if self.clients[0].shares(n)]
        weights = self.uploaded_weights if weights is None else weights
        return weighted_average([named_tensors(m) for m in self.uploaded_models], weights, names)

    def end_round(self, rnd: int) -> None:
        """Extra per-round server step (after aggregation); nothing by default."""

    def finish(self) -> None:
        """Extra step after the last round (e.g. FedBABU's fine-tuning); nothing by default."""

    # ----- evaluation --------------------------------------------------------------------------
    def evaluate(self, clients: Optional[Sequence[Client]] = None, prefix: str = "rs") -> Summary:
        """Sample-weighted test accuracy/AUC over all clients and train loss (PFLLIB.md section 6)."""
        clients = self.clients if clients is None else clients
        test = [c.test_metrics() for c in clients]
        losses, counts = zip(*(c.train_metrics() for c in clients))
        summary = summarize(test, losses, counts)
        self.record(f"{prefix}_test_acc", summary.accuracy)
        self.record(f"{prefix}_test_auc", summary.auc)
        self.record(f"{prefix}_train_loss", summary.train_loss)
        self.record(f"{prefix}_client_acc", summary.client_accuracy)
        if prefix == "rs":
            self.record("rs_eval_round", self.current_round)
        return summary

    def record(self, name: str, value) -> None:
        self.history.setdefault(name, []).append(value)

    def evaluate_new_clients(self) -> Summary:
        """Clients never seen in training get the global model, fine-tune ``-ften`` epochs, and are tested."""
        self.new_clients = self.set_clients(range(self.num_clients, self.num_clients + self.num_new_clients))
        shared = self.global_shared_module()
        for client in self.new_clients:
            client.set_parameters(shared)
            client.fine_tune(self.fine_tuning_epoch_new)
        return self.evaluate(self.new_clients, prefix="rs_new")

    @staticmethod
    def check_done(values: Sequence[float], top_cnt: int) -> bool:
        """True when the best value is more than ``top_cnt`` evaluations old."""
        if len(values) <= top_cnt:
            return False
        return len(values) - 1 - int(np.argmax(values)) > top_cnt

    # ----- state (checkpoints) -----------------------------------------------------------------
    def get_state(self) -> dict:
        """Everything needed to continue the run: server attributes and every client's state."""
        names = ("global_model", "sampler", "current_round", "history") + tuple(self.persistent_attrs)
        state = export_attrs(self, names)
        state["clients"] = [client.get_state() for client in self.clients]
        return state

    def set_state(self, state: dict) -> None:
        state = dict(state)
        for client, client_state in zip(self.clients, state.pop("clients")):
            client.set_state(client_state)
        import_attrs(self, state)
        self._bind_history()

    def checkpoint_folder(self) -> Path:
        return checkpoint_folder(self.results_file())

    def save_checkpoint(self, rnd: int) -> Path:
        """Everything needed to continue after round ``rnd``, including every random generator."""
        payload = {"config": vars(self.args), "server": self.get_state(), "rng": global_rng_state()}
        return save_checkpoint(self.checkpoint_folder(), rnd, payload)

    def resume(self) -> Optional[str]:
        """Continue from the newest usable checkpoint of this run; returns a note for the user, if any.

        Refuses (``CheckpointError``) when the checkpoint was made with different flags.
        """
        found = load_latest_checkpoint(self.checkpoint_folder())
        if found is None:
            return "no checkpoint to resume from; starting from round 0"
        differences = config_differences(found.payload["config"], vars(self.args))
        if differences:
            raise CheckpointError("cannot resume: the checkpoint was made with other flags ("
                                  + "; ".join(differences) + "); rerun with the original flags or without --resume")
        self.set_state(found.payload["server"])
        set_global_rng_state(found.payload["rng"])
        self.current_round = found.round + 1
        notes = [f"skipped {s}" for s in found.skipped]
        return "; ".join(notes + [f"resumed after round {found.round}"])

    # ----- results -----------------------------------------------------------------------------
    def result_arrays(self) -> Dict[str, np.ndarray]:
        """Everything saved to the run's .h5; subclasses and mixins extend it."""
        return {name: np.asarray(values) for name, values in self.history.items()}

    def result_attrs(self) -> Dict[str, object]:
        return {"config": portable_config(vars(self.args)), "run": self.times, "algorithm": self.algorithm,
                "dataset": self.dataset, "rounds_done": len(self.history["rs_round_time"])}

    def results_file(self) -> Path:
        folder = Path(self.args.results_dir) if self.args.results_dir else RESULTS_DIR
        return result_path(folder, self.dataset, self.algorithm, self.goal, self.times)

    def save_results(self, complete: bool = False) -> Path:
        """Write the run's .h5; ``complete`` marks a run that reached its end (batch tools skip those)."""
        path = self.results_file()
        write_results(path, self.result_arrays(), dict(self.result_attrs(), complete=complete))
        return path
