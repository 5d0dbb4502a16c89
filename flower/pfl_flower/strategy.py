"""FedLAG's server side as a Flower Strategy (Message API): runs inside the ServerApp process.

Each round (``Strategy.start`` drives it):

* ``configure_train``: FedAvg's sampling and messages; the full global model is sent, and
  ``config["lag-personal"]`` names the parameter tensors every client must keep as its own;
* ``aggregate_train``: from the replies (sorted by partition, so the result does not depend on
  arrival order) the per-layer conflict scores are computed with the project's
  ``flcore.lag.conflict`` on the clients' updates, the personal set is chosen by the project's ``LayerSelector``
  (the same rule and history as ``LayerConflictMixin``), and every tensor is averaged sample-weighted with ``flcore.aggregation`` (FedAvg).
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
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from flcore.aggregation import sample_weights, weighted_average
from flcore.exchange import magnitude_limit, tensor_spec, update_problem
from flcore.lag.conflict import build_layers, layer_evidence, stack_layer_updates
from flcore.lag.selector import LagSettings, LayerSelector
from utils.metrics import ClientTestStats, summarize

from . import task


class FedLagStrategy(FedAvg):
    """FedAvg whose server keeps, every round, the most conflicting layers personal on the clients.

    ``settings``: checked already, with the run's flags (``task.project_config``). ``parameter_names``: the
    model's ``named_parameters()`` names, in order (layers are built from parameters only, never from
    buffers; ties in the ranking go to the earlier layer). The nodes are evaluated after every
    ``eval_gap``-th round and after the last one (``num_rounds``). ``train_samples``: each partition's
    training samples, when the server can read the dataset: a reply may not weigh more than its own.
    """

    def __init__(self, settings: LagSettings, parameter_names: Sequence[str], num_rounds: int,
                 eval_gap: int = 1, train_samples: Optional[Sequence[int]] = None, **fedavg_kwargs):
        super().__init__(**fedavg_kwargs)
        self.num_rounds = num_rounds
        self.eval_gap = max(int(eval_gap), 1)
        if settings.signal != "delta":
            raise ValueError("the Flower app scores the update theta_after - theta_start (--lag_signal delta)")
        if settings.share != "own":
            raise ValueError("the Flower app keeps every personal layer on its own node (--lag_share own)")
        self.lag = settings
        # The layer choice is the same object LayerConflictMixin uses: same rule, same history.
        self.selector = LayerSelector(settings, build_layers(list(parameter_names), settings.granularity))
        self.layers = self.selector.layers
        self.history: Dict[str, list] = {"round_time": [],
                                          "test_acc": [], "test_auc": [], "train_loss": [], "client_acc": [],
                                          "eval_round": [], "clients": [], "failed_train": [],
                                          "failed_evaluate": []}
        # Every sampled node whose reply was an error or never came: {"round", "phase", "node",
        # "partition" (-1 if it never replied), "reason"}. A run with any is not marked complete.
        self.failures: List[dict] = []
        self._sent: Dict[str, List[int]] = {"train": [], "evaluate": []}  # node ids messaged this round
        self._partition_of: Dict[int, int] = {}  # node id -> partition id, from its replies
        self._node_of: Dict[int, int] = {}       # partition id -> node id, the other way
        # What this round's training messages carried: replies are checked against it.
        self._sent_spec: Dict[str, tuple] = {}
        self._sent_limit: Optional[float] = None
        self.train_samples = None if train_samples is None else [int(n) for n in train_samples]
        self._round_start = 0.0

    def summary(self) -> None:
        super().summary()
        log(INFO, "\t└──> FedLAG: K=%d, xi=%s, %s, %s layers (%d candidates)", self.lag.top_k, self.lag.xi,
            self.lag.schedule, self.lag.granularity, len(self.layers))

    # ----- names -----------------------------------------------------------------------------------------
    def personal_names(self) -> List[str]:
        """Parameter tensors currently kept personal on every client."""
        return self.selector.personal_names()

    def _with_personal(self, config: ConfigRecord) -> ConfigRecord:
        config["lag-personal"] = " ".join(self.personal_names())
        return config

    # ----- training ----------------------------------------------------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self._round_start = time.perf_counter()
        messages = list(super().configure_train(server_round, arrays, self._with_personal(config), grid))
        self._sent["train"] = [m.metadata.dst_node_id for m in messages]
        self.expect_replies_to(arrays)
        return messages

    def expect_replies_to(self, arrays: ArrayRecord) -> None:
        """Remember what a round's training messages carry: each reply is checked against it."""
        sent = task.from_record(arrays)
        self._sent_spec, self._sent_limit = tensor_spec(sent), magnitude_limit(sent)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> Tuple[Optional[ArrayRecord], Optional[MetricRecord]]:
        contents = self._checked(server_round, self._collect(server_round, replies, "train"))
        if not contents:
            self.selector.observe(None, uploads=0)  # the round still gets its row
            self.history["round_time"].append(time.perf_counter() - self._round_start)
            return None, None
        states = [c["state"] for c in contents]
        updates = [c["delta"] for c in contents]
        counts = [c["count"] for c in contents]

        # A single client has no pair to conflict with: the round is recorded, unscored.
        evidence = (layer_evidence(stack_layer_updates(updates, self.layers), self.lag.xi) if len(updates) >= 2
                    else None)
        self.selector.observe(evidence, uploads=len(updates))
        for note in self.selector.notes:
            log(WARNING, "\t└──> %s", note)
        self.selector.notes.clear()
        average = weighted_average(states, sample_weights(counts))
        self.history["round_time"].append(time.perf_counter() - self._round_start)
        log(INFO, "\t└──> FedLAG round %d: conflict scores %s; personal: %s", server_round,
            self.selector.history["scores"][-1].tolist(), self.personal_names() or "none")
        return task.to_record(average), MetricRecord({"num-uploads": len(updates)})

    # ----- evaluation --------------------------------------------------------------------------------------
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        if server_round % self.eval_gap and server_round != self.num_rounds:
            self._sent["evaluate"] = []
            return []
        messages = list(super().configure_evaluate(server_round, arrays, self._with_personal(config), grid))
        self._sent["evaluate"] = [m.metadata.dst_node_id for m in messages]
        return messages

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> Optional[MetricRecord]:
        contents = self._collect(server_round, replies, "evaluate")
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
        h = self.history
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
                **{name: np.asarray(value) for name, value in self.selector.result_arrays().items()},
                "rs_failed_nodes": np.asarray(h["failed_train"], dtype=np.int64),
                "rs_failed_evaluate_nodes": np.asarray(h["failed_evaluate"], dtype=np.int64)}

    def run_status(self) -> Dict[str, object]:
        """The result file's status attributes: ``complete`` only if no sampled node failed or went
        missing, ``failures`` (each: round, phase, node, partition, reason), ``rounds_done``."""
        return {"complete": not self.failures, "failures": list(self.failures),
                "rounds_done": len(self.selector.history["uploads"])}

    # ----- replies -----------------------------------------------------------------------------------------
    def _checked(self, server_round: int, contents: list) -> list:
        """The training replies that may be averaged, read once: ``state`` (the trained tensors), ``delta``
        (the update scored) and ``count`` (its weight). Each reply is checked against what was sent
        (:func:`~flcore.exchange.update_problem`: names, shapes, dtypes, finite values of a sane
        magnitude, a sample count of at most the partition's training samples when the run knows them);
        one that fails is that node's failure for the round, as an error reply is, and never averaged."""
        checked = []
        for content in contents:
            metrics = content["metrics"]
            partition = int(metrics["partition-id"])
            try:
                state, delta = task.from_record(content["arrays"]), task.from_record(content["update"])
            except Exception as err:  # noqa: BLE001 - whatever a node sent that is not arrays
                problem = f"its arrays cannot be read ({type(err).__name__})"
            else:
                count = metrics["num-examples"]
                most = (self.train_samples[partition] if self.train_samples is not None
                        and 0 <= partition < len(self.train_samples) else None)
                problem = (update_problem(state, self._sent_spec, count, most, limit=self._sent_limit)
                           or update_problem(delta, self._sent_spec, count, most))
            if problem is None:
                checked.append({"state": state, "delta": delta, "count": int(count)})
                continue
            node = self._node_of.get(partition, -1)
            self.failures.append({"round": server_round, "phase": "train", "node": node, "partition": partition,
                                  "reason": f"reply left out of the average: {problem}"})
            self.history["failed_train"][-1] += 1
            log(WARNING, "aggregate_train: round %d: partition %d's reply is left out of the average: %s",
                server_round, partition, problem)
        if contents and not checked:
            raise RuntimeError(f"aggregate_train: round {server_round}: no reply could be averaged; first: "
                               f"{self.failures[-1]['reason']}")
        return checked

    def _collect(self, server_round: int, replies: Iterable[Message], phase: str) -> list:
        """The contents of the replies without errors, ordered by the clients' partition ids.

        Every sampled node that replied with an error, or did not reply, is recorded in
        :attr:`failures` (and counted in ``rs_failed_nodes`` / ``rs_failed_evaluate_nodes``), so that a
        result missing some clients is never written as complete. A round in which no sampled node
        answered stops the run (with the first node's error), rather than carrying on with an unchanged
        model.
        """
        contents, errors, replied = [], [], set()
        for msg in replies:
            node = int(msg.metadata.src_node_id)
            replied.add(node)
            if msg.has_error():
                errors.append((node, str(msg.error.reason)))
            else:
                contents.append(msg.content)
                self._partition_of[node] = int(msg.content["metrics"]["partition-id"])
                self._node_of[self._partition_of[node]] = node
        missing = [n for n in self._sent[phase] if n not in replied]
        self._sent[phase] = []
        failed = errors + [(node, "no reply (the node left, or did not answer in time)") for node in missing]
        for node, reason in failed:
            self.failures.append({"round": server_round, "phase": phase, "node": node,
                                  "partition": self._partition_of.get(node, -1), "reason": reason})
            log(WARNING, "aggregate_%s: round %d: node %d (partition %d) failed: %s", phase, server_round, node,
                self._partition_of.get(node, -1), reason)
        self.history[f"failed_{phase}"].append(len(failed))
        log(INFO, "aggregate_%s: %d replies, %d failed", phase, len(contents), len(failed))
        if failed and not contents:
            raise RuntimeError(f"aggregate_{phase}: every node failed; first error: node {failed[0][0]}: "
                               f"{failed[0][1]}")
        return sorted(contents, key=lambda c: int(c["metrics"]["partition-id"]))

