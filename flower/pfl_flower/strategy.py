"""FedLAG's server side as a Flower Strategy (Message API): runs inside the ServerApp process.

Each round (``Strategy.start`` drives it):

* ``configure_train``: FedAvg's sampling and messages; the full global model is sent, and
  ``config["lag-personal"]`` names the parameter tensors every client must keep as its own;
* ``aggregate_train``: from the replies (sorted by partition, so the result does not depend on
  arrival order) the per-layer conflict scores are computed with the project's
  ``flcore.lag.conflict`` on the clients' updates, the personal set is chosen (top-K, ``every_round``
  or ``warmup``), and every tensor is averaged sample-weighted with ``flcore.aggregation`` (FedAvg).
  Personal layers are averaged too, only to initialise clients that never held a copy: clients never
  load them over their own (see ``client_app``);
* ``configure_evaluate`` / ``aggregate_evaluate``: every node tests the model it holds after the
  broadcast; the project's evaluation formula (``utils.metrics.summarize``) makes the round's numbers.

Everything is recorded in :attr:`FedLagStrategy.history`, written by ``server_app`` as the project's
``.h5`` (``rs_*`` and ``lag_*`` arrays).
"""
from __future__ import annotations

import time
from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from flcore.aggregation import sample_weights, weighted_average
from flcore.lag.conflict import build_layers, conflict_scores, stack_layer_updates
from flcore.lag.mixin import LagSettings
from utils.metrics import ClientTestStats, summarize

from . import task


class FedLagStrategy(FedAvg):
    """FedAvg whose server keeps, every round, the most conflicting layers personal on the clients.

    ``parameter_names``: the model's ``named_parameters()`` names, in order (layers are built from
    parameters only, never from buffers; ties in the ranking go to the earlier layer). The nodes are
    evaluated after every ``eval_gap``-th round and after the last one (``num_rounds``).
    """

    def __init__(self, settings: LagSettings, parameter_names: Sequence[str], num_rounds: int,
                 eval_gap: int = 1, **fedavg_kwargs):
        super().__init__(**fedavg_kwargs)
        self.num_rounds = num_rounds
        self.eval_gap = max(int(eval_gap), 1)
        settings.check()
        if settings.signal != "delta":
            raise ValueError("the Flower app scores the update theta_after - theta_start (--lag_signal delta)")
        self.lag = settings
        self.layers = build_layers(list(parameter_names), settings.granularity)
        self.personal: Tuple[int, ...] = ()
        self.score_total: Optional[torch.Tensor] = None
        self.rounds_scored = 0
        self.history: Dict[str, list] = {"scores": [], "personal": [], "uploads": [], "round_time": [],
                                          "test_acc": [], "test_auc": [], "train_loss": [], "client_acc": [],
                                          "eval_round": [], "clients": []}
        self._round_start = 0.0

    def summary(self) -> None:
        super().summary()
        log(INFO, "\t└──> FedLAG: K=%d, xi=%s, %s, %s layers (%d candidates)", self.lag.top_k, self.lag.xi,
            self.lag.schedule, self.lag.granularity, len(self.layers))

    # ----- names -----------------------------------------------------------------------------------------
    def personal_names(self) -> List[str]:
        """Parameter tensors currently kept personal on every client."""
        return [name for i in self.personal for name in self.layers[i].tensors]

    def _with_personal(self, config: ConfigRecord) -> ConfigRecord:
        config["lag-personal"] = " ".join(self.personal_names())
        return config

    # ----- training ----------------------------------------------------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self._round_start = time.perf_counter()
        return super().configure_train(server_round, arrays, self._with_personal(config), grid)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> Tuple[Optional[ArrayRecord], Optional[MetricRecord]]:
        contents = _sorted_contents(replies, "aggregate_train")
        if not contents:
            return None, None
        states = [task.from_record(c["arrays"]) for c in contents]
        updates = [task.from_record(c["update"]) for c in contents]
        counts = [int(c["metrics"]["num-examples"]) for c in contents]
        for name, state in (("arrays", states), ("update", updates)):
            if any(set(s) != set(state[0]) for s in state):
                raise ValueError(f"clients replied with different tensor names in {name!r}")

        scored = len(updates) >= 2  # a single client has no pair to conflict with
        scores = (conflict_scores(stack_layer_updates(updates, self.layers), self.lag.xi) if scored
                  else torch.zeros(len(self.layers), dtype=torch.int64))
        self._choose(scores, scored)
        average = weighted_average(states, sample_weights(counts))

        chosen = np.zeros(len(self.layers), dtype=bool)
        chosen[list(self.personal)] = True
        self.history["scores"].append(scores.numpy())
        self.history["personal"].append(chosen)
        self.history["uploads"].append(len(updates))
        self.history["round_time"].append(time.perf_counter() - self._round_start)
        log(INFO, "\t└──> FedLAG round %d: conflict scores %s; personal: %s", server_round,
            scores.tolist(), self.personal_names() or "none")
        return task.to_record(average), MetricRecord({"num-uploads": len(updates)})

    def _choose(self, scores: torch.Tensor, scored: bool) -> None:
        """The personal set after this round (the rule of ``LayerConflictMixin``)."""
        self.personal, self.score_total = self.lag.next_personal(scores, scored, self.rounds_scored, self.personal,
                                                                 self.score_total)
        self.rounds_scored += 1

    # ----- evaluation --------------------------------------------------------------------------------------
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        if server_round % self.eval_gap and server_round != self.num_rounds:
            return []
        return super().configure_evaluate(server_round, arrays, self._with_personal(config), grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> Optional[MetricRecord]:
        contents = _sorted_contents(replies, "aggregate_evaluate")
        if not contents:
            return None
        metrics = [c["metrics"] for c in contents]
        test = [ClientTestStats(int(m["correct"]), int(m["num-examples"]), float(m["auc"])) for m in metrics]
        summary = summarize(test, [float(m["train-loss-sum"]) for m in metrics],
                            [int(m["train-samples"]) for m in metrics])
        self.history["test_acc"].append(summary.accuracy)
        self.history["test_auc"].append(summary.auc)
        self.history["train_loss"].append(summary.train_loss)
        self.history["client_acc"].append(summary.client_accuracy)
        self.history["clients"].append([int(m["partition-id"]) for m in metrics])
        self.history["eval_round"].append(server_round)
        return MetricRecord({"accuracy": summary.accuracy, "auc": summary.auc, "train-loss": summary.train_loss})

    # ----- results -----------------------------------------------------------------------------------------
    def result_arrays(self) -> Dict[str, np.ndarray]:
        """The project's result arrays (``rs_*``, ``lag_*``), as ``LayerConflictMixin.lag_results``."""
        h, width = self.history, len(self.layers)

        def rows(key: str, dtype) -> np.ndarray:
            return np.stack(h[key]).astype(dtype) if h[key] else np.zeros((0, width), dtype=dtype)
        same_clients = len({tuple(c) for c in h["clients"]}) <= 1
        return {"rs_test_acc": np.asarray(h["test_acc"], dtype=float),
                "rs_test_auc": np.asarray(h["test_auc"], dtype=float),
                "rs_train_loss": np.asarray(h["train_loss"], dtype=float),
                "rs_eval_round": np.asarray(h["eval_round"], dtype=np.int64),
                "rs_client_acc": (np.stack(h["client_acc"]) if h["client_acc"] and same_clients
                                  else np.zeros((0, 0))),
                "rs_client_ids": (np.asarray(h["clients"], dtype=np.int64) if h["clients"] and same_clients
                                  else np.zeros((0, 0), dtype=np.int64)),
                "rs_round_time": np.asarray(h["round_time"], dtype=float),
                "lag_layer_names": np.asarray([layer.name for layer in self.layers]),
                "lag_conflict_scores": rows("scores", np.int64),
                "lag_personal": rows("personal", bool),
                "lag_num_uploads": np.asarray(h["uploads"], dtype=np.int64)}


def _sorted_contents(replies: Iterable[Message], where: str) -> list:
    """The contents of the replies without errors, ordered by the clients' partition ids.

    A round in which every node failed stops the run (with the first node's error), rather than
    carrying on with an unchanged model and writing results that look complete.
    """
    contents, errors = [], []
    for msg in replies:
        if msg.has_error():
            errors.append(f"node {msg.metadata.src_node_id}: {msg.error.reason}")
            log(WARNING, "%s: %s", where, errors[-1])
        else:
            contents.append(msg.content)
    log(INFO, "%s: %d replies, %d errors", where, len(contents), len(errors))
    if errors and not contents:
        raise RuntimeError(f"{where}: every node failed; first error: {errors[0]}")
    return sorted(contents, key=lambda c: int(c["metrics"]["partition-id"]))
