"""FedLAG's server side as a Flower Strategy (Message API): runs inside the ServerApp process.

Each round (``Strategy.start`` drives it):

* ``configure_train``: FedAvg's sampling and messages; the full global model is sent, and
  ``config["lag-personal"]`` names the parameter tensors every client must keep as its own. With
  ``--lag_share groups`` (run-config ``lag-share = "groups"``) a node whose partition is in a group of a
  personal layer gets its own message, its payload: the arrays carry its group's model of that layer,
  and ``config["lag-group"]`` names those tensors, which the node loads over its own copy (one message
  object for all the members of the same groups);
* ``aggregate_train``: from the replies (sorted by partition, so the result does not depend on
  arrival order) the per-layer conflict scores are computed with the project's
  ``flcore.lag.conflict`` on the clients' updates, the personal set is chosen by the project's ``LayerSelector``
  (the same rule and history as ``LayerConflictMixin``), and every tensor is averaged sample-weighted with ``flcore.aggregation`` (FedAvg).
  Personal layers are averaged too, only to initialise clients that never held a copy: clients never
  load them over their own (see ``client_app``). With ``--lag_share groups`` the personal layers' updates
  also update the groups, and each group's model is formed from its members' copies
  (``flcore.lag.sharing``, as ``LayerConflictMixin`` does): a node's copy is what it keeps between
  messages, its last trained arrays, which the server holds for every partition that replied;
* ``configure_evaluate`` / ``aggregate_evaluate``: every node tests the model it holds after the
  broadcast; the project's evaluation formula (``utils.metrics.summarize``) makes the round's numbers.

Every reply is checked at the edge before it is used, as an upload is (``FedLagStrategy._usable``): a
partition id of the run claimed by no other reply of the round, then, for training, the arrays and sample
count against what was sent and what the partition holds, and for evaluation, the counts, AUC and loss
within their ranges. A reply that fails is that node's failure for the round, named, and the round goes on
with the others.

Everything is recorded in :attr:`FedLagStrategy.history`, written by ``server_app`` as the project's
``.h5`` (``rs_*`` and ``lag_*`` arrays).
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from flcore.aggregation import sample_weights, weighted_average
from flcore.exchange import magnitude_limit, tensor_spec, update_problem
from flcore.lag.conflict import build_layers, layer_evidence, stack_layer_updates
from flcore.lag.selector import LagSettings, LayerSelector
from flcore.lag.sharing import GroupSharing
from utils.metrics import ClientTestStats, summarize

from . import task


class FedLagStrategy(FedAvg):
    """FedAvg whose server keeps, every round, the most conflicting layers personal on the clients.

    ``settings``: checked already, with the run's flags (``task.project_config``). ``parameter_names``: the
    model's ``named_parameters()`` names, in order (layers are built from parameters only, never from
    buffers; ties in the ranking go to the earlier layer). The nodes are evaluated after every
    ``eval_gap``-th round and after the last one (``num_rounds``). ``train_samples`` / ``test_samples``:
    each of the run's partitions' training and test samples (the dataset's ``config.json``, which the
    server reads to build the model): the partition ids are 0..len-1, and no reply may count more
    samples than its partition holds.
    """

    def __init__(self, settings: LagSettings, parameter_names: Sequence[str], num_rounds: int,
                 train_samples: Sequence[int], test_samples: Sequence[int], eval_gap: int = 1, **fedavg_kwargs):
        super().__init__(**fedavg_kwargs)
        self.train_samples, self.test_samples = [int(n) for n in train_samples], [int(n) for n in test_samples]
        if not self.train_samples or len(self.train_samples) != len(self.test_samples):
            raise ValueError(f"train_samples and test_samples must give one count per partition, got "
                             f"{len(self.train_samples)} and {len(self.test_samples)}")
        self.num_clients = len(self.train_samples)
        self.num_rounds = num_rounds
        self.eval_gap = max(int(eval_gap), 1)
        if settings.signal != "delta":
            raise ValueError("the Flower app scores the update theta_after - theta_start (--lag_signal delta)")
        if settings.share == "check":
            raise ValueError("lag-share = \"check\" is not in the Flower app yet: a node would have to compare the "
                             "copies on its held-out data before training; use \"own\" or \"groups\"")
        if settings.upload == "sketch":
            raise ValueError("lag-upload = \"sketch\" is not in the Flower app yet: a node would have to send the "
                             "sketches of its personal layers; use \"all\"")
        self.lag = settings
        self.parameter_names = list(parameter_names)
        # The layer choice is the same object LayerConflictMixin uses: same rule, same history.
        self.selector = LayerSelector(settings, build_layers(self.parameter_names, settings.granularity))
        self.layers = self.selector.layers
        # --lag_share groups: the groups and their models (LayerConflictMixin's object), and each partition's
        # copy, its last trained arrays and sample count, which a group's model averages.
        self.sharing = (GroupSharing(self.num_clients, settings.group_cosine, settings.xi)
                        if settings.share == "groups" else None)
        self.held: Dict[int, Tuple[Dict, int]] = {}
        self.history: Dict[str, list] = {"round_time": [],
                                          "test_acc": [], "test_auc": [], "train_loss": [], "client_acc": [],
                                          "eval_round": [], "clients": [], "failed_train": [],
                                          "failed_evaluate": []}
        # Every sampled node whose reply was an error, never came or failed a check: {"round", "phase",
        # "node", "partition" (-1 if unknown), "reason"}. A run with any is not marked complete.
        self.failures: List[dict] = []
        self._sent: Dict[str, List[int]] = {"train": [], "evaluate": []}  # node ids messaged this round
        self._partition_of: Dict[int, int] = {}  # node id -> partition id, from its usable replies
        # What this round's training messages carried: replies are checked against it. The trained arrays
        # carry every tensor sent; the update only the parameters (buffers are not trained by a gradient,
        # and layers are never scored on them).
        self._sent_spec: Dict[str, tuple] = {}
        self._update_spec: Dict[str, tuple] = {}
        self._sent_limit: Optional[float] = None
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
        messages = self._payloads(super().configure_train(server_round, arrays, self._with_personal(config), grid))
        self._sent["train"] = [m.metadata.dst_node_id for m in messages]
        self.expect_replies_to(arrays)
        return messages

    def _payloads(self, messages: Iterable[Message]) -> List[Message]:
        """Each message as its node's payload: FedAvg's, or for a node in a group of a personal layer, one
        whose arrays carry the group's model and whose ``lag-group`` names it (one record per set of groups)."""
        messages = list(messages)
        if self.sharing is None:
            return messages
        records: Dict[int, RecordDict] = {}
        out = []
        for message in messages:
            partition = self._partition_of.get(int(message.metadata.dst_node_id))
            part = None if partition is None else self.sharing.payload(partition)
            if not part:
                out.append(message)
                continue
            if id(part) not in records:
                arrays = task.from_record(message.content[self.arrayrecord_key])
                arrays.update(part)
                config = ConfigRecord(dict(message.content[self.configrecord_key]))
                config["lag-group"] = " ".join(part)
                records[id(part)] = RecordDict({self.arrayrecord_key: task.to_record(arrays),
                                                self.configrecord_key: config})
            out.append(Message(content=records[id(part)], message_type=message.metadata.message_type,
                               dst_node_id=message.metadata.dst_node_id))
        return out

    def expect_replies_to(self, arrays: ArrayRecord) -> None:
        """Remember what a round's training messages carry: each reply is checked against it."""
        sent = task.from_record(arrays)
        self._sent_spec, self._sent_limit = tensor_spec(sent), magnitude_limit(sent)
        parameters = set(self.parameter_names)
        self._update_spec = {name: spec for name, spec in self._sent_spec.items() if name in parameters}

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> Tuple[Optional[ArrayRecord], Optional[MetricRecord]]:
        contents, failed = self._usable(server_round, "train", replies, self._read_train)
        if not contents:
            if failed:  # carrying on would train the next round on an unchanged model, perhaps with no node left
                first = failed[0]
                raise RuntimeError(f"aggregate_train: round {server_round}: no reply could be averaged; first "
                                   f"failure: node {first['node']} (partition {first['partition']}): "
                                   f"{first['reason']}")
            self.selector.observe(None, uploads=0)  # nothing was sent: the round still gets its row
            if self.sharing is not None:
                self.sharing.regroup({}, [], self.selector.personal, len(self.layers))
                self.sharing.clear()
            self.history["round_time"].append(time.perf_counter() - self._round_start)
            return None, None
        states = [c["state"] for c in contents]
        updates = [c["delta"] for c in contents]
        counts = [c["count"] for c in contents]

        # A single client has no pair to conflict with: the round is recorded, unscored.
        evidence = (layer_evidence(stack_layer_updates(updates, self.layers), self.lag.xi) if len(updates) >= 2
                    else None)
        self.selector.observe(evidence, uploads=len(updates))
        if self.sharing is not None:
            self._share_within_groups(contents)
        for note in self.selector.notes:
            log(WARNING, "\t└──> %s", note)
        self.selector.notes.clear()
        average = weighted_average(states, sample_weights(counts))
        self.history["round_time"].append(time.perf_counter() - self._round_start)
        log(INFO, "\t└──> FedLAG round %d: conflict scores %s; personal: %s", server_round,
            self.selector.history["scores"][-1].tolist(), self.personal_names() or "none")
        return task.to_record(average), MetricRecord({"num-uploads": len(updates)})

    def _share_within_groups(self, contents: List[dict]) -> None:
        """The personal layers' updates join the profiles, the groups are updated, and each group's model is
        formed from its members' copies (their last trained arrays: a node keeps nothing else)."""
        personal = self.selector.personal
        for content in contents:
            self.held[content["partition"]] = (content["state"], content["count"])
        stacked = stack_layer_updates([c["delta"] for c in contents], [self.layers[l] for l in personal])
        self.sharing.regroup(dict(zip(personal, stacked)), [c["partition"] for c in contents], personal,
                             len(self.layers))
        samples = [self.held[p][1] if p in self.held else 0 for p in range(self.num_clients)]
        self.sharing.share(personal, self._with_buffers, lambda p: self.held[p][0], samples)

    def _with_buffers(self, layer: int) -> List[str]:
        """Layer ``layer``'s parameters and the buffers of their modules, as the arrays sent name them."""
        parameters = set(self.parameter_names)
        names = list(self.layers[layer].tensors)
        for name in self.layers[layer].tensors:
            module = name.rpartition(".")[0]
            prefix = f"{module}." if module else ""
            names += [n for n in self._sent_spec if n.startswith(prefix) and "." not in n[len(prefix):]
                      and n not in parameters and n not in names]
        return names

    # ----- evaluation --------------------------------------------------------------------------------------
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        if server_round % self.eval_gap and server_round != self.num_rounds:
            self._sent["evaluate"] = []
            return []
        messages = self._payloads(super().configure_evaluate(server_round, arrays, self._with_personal(config), grid))
        self._sent["evaluate"] = [m.metadata.dst_node_id for m in messages]
        return messages

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> Optional[MetricRecord]:
        results, _ = self._usable(server_round, "evaluate", replies, self._read_evaluate)
        if not sum(r["test"].num_samples for r in results):
            # Nothing to summarise (no evaluation this round, or no usable reply: the failures say why). As
            # with -eg, the round is then absent from rs_eval_round and from every series aligned with it:
            # rs_test_acc never holds NaN (reports refuse such a file), and run tables show the round blank.
            return None
        summary = summarize([r["test"] for r in results], [r["loss"] for r in results],
                            [r["train"] for r in results])
        self.history["test_acc"].append(summary.accuracy)
        self.history["test_auc"].append(summary.auc)
        self.history["train_loss"].append(summary.train_loss)
        self.history["client_acc"].append(summary.client_accuracy)
        self.history["clients"].append([r["partition"] for r in results])
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
                **({"lag_groups": self.sharing.result_rows(0, len(self.layers)).numpy()} if self.sharing else {}),
                "rs_failed_nodes": np.asarray(h["failed_train"], dtype=np.int64),
                "rs_failed_evaluate_nodes": np.asarray(h["failed_evaluate"], dtype=np.int64)}

    def run_status(self) -> Dict[str, object]:
        """The result file's status attributes: ``complete`` only if no sampled node failed or went
        missing, ``failures`` (each: round, phase, node, partition, reason), ``rounds_done``."""
        return {"complete": not self.failures, "failures": list(self.failures),
                "rounds_done": len(self.selector.history["uploads"])}

    # ----- replies ---------------------------------------------------------------------------------------
    def _usable(self, server_round: int, phase: str, replies: Iterable[Message], read) -> Tuple[list, List[dict]]:
        """What ``read(partition, content)`` makes of each usable reply, ordered by partition, and the round's
        failures, in node order (neither depends on the order the replies arrived in).

        Every reply is checked at the edge, as an upload is: it must carry a ``metrics`` record whose
        ``partition-id`` is a client of the run and claimed by no other reply of the round, then pass
        ``read`` (which raises :class:`ReplyProblem`). Each sampled node whose reply is an error, never
        came, or fails a check is that node's failure for the round: recorded in :attr:`failures` with
        its node and partition (-1 when unknown) and counted in ``rs_failed_nodes`` /
        ``rs_failed_evaluate_nodes``, so that a result missing some clients is never written as complete.
        """
        first_failure = len(self.failures)
        self.history[f"failed_{phase}"].append(0)
        claims: Dict[int, List[tuple]] = {}  # partition -> [(node, content)] of the replies claiming it
        replied = set()
        for msg in sorted(replies, key=lambda m: int(m.metadata.src_node_id)):  # failures in node order too
            node = int(msg.metadata.src_node_id)
            replied.add(node)
            if msg.has_error():
                self._fail(server_round, phase, node, None, str(msg.error.reason))
                continue
            try:
                partition = self._claimed_partition(msg.content)
            except ReplyProblem as problem:
                self._fail(server_round, phase, node, None, str(problem), checked=True)
                continue
            claims.setdefault(partition, []).append((node, msg.content))
        for node in sorted(self._sent[phase]):  # in node order, as the replies: not in sampling order
            if node not in replied:
                self._fail(server_round, phase, node, None, "no reply (the node left, or did not answer in time)")
        self._sent[phase] = []
        usable = []
        for partition, claimants in sorted(claims.items()):
            if len(claimants) > 1:
                # Node ids come from the SuperLink, partition ids are each node's word: the server cannot tell
                # which claimant holds the partition, and keeping the first to arrive would let the faster
                # node decide. None is used.
                nodes = ", ".join(str(node) for node, _ in claimants)
                for node, _ in claimants:
                    self._fail(server_round, phase, node, partition,
                               f"partition-id {partition} is claimed by nodes {nodes} in this round", checked=True)
                continue
            [(node, content)] = claimants
            self._partition_of[node] = partition
            try:
                usable.append(read(partition, content))
            except ReplyProblem as problem:
                self._fail(server_round, phase, node, partition, str(problem), checked=True)
        failed = self.failures[first_failure:]
        log(INFO, "aggregate_%s: %d replies used, %d failed", phase, len(usable), len(failed))
        return usable, failed

    def _fail(self, server_round: int, phase: str, node: int, partition: Optional[int], reason: str,
              checked: bool = False) -> None:
        """Record node ``node``'s failure for the round (``checked``: its reply arrived and failed a check)."""
        if partition is None:
            partition = self._partition_of.get(node, -1)  # known from an earlier reply, if any
        if checked:
            reason = f"reply left out of the {_USE[phase]}: {reason}"
        self.failures.append({"round": server_round, "phase": phase, "node": node, "partition": partition,
                              "reason": reason})
        self.history[f"failed_{phase}"][-1] += 1
        log(WARNING, "aggregate_%s: round %d: node %d (partition %d) failed: %s", phase, server_round, node,
            partition, reason)

    def _claimed_partition(self, content: RecordDict) -> int:
        """The reply's ``partition-id``: a client of the run (0..num_clients-1), or a :class:`ReplyProblem`."""
        metrics = content.get("metrics")
        if not isinstance(metrics, MetricRecord):
            raise ReplyProblem("it carries no metrics record")
        value = _present(metrics, "partition-id")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < self.num_clients:
            raise ReplyProblem(f"its partition-id {value!r} is not a client of the run (0..{self.num_clients - 1})")
        return value

    def _read_train(self, partition: int, content: RecordDict) -> dict:
        """A training reply's ``state`` (the trained tensors), ``delta`` (the update scored) and ``count`` (its
        weight), checked against what was sent (:func:`~flcore.exchange.update_problem`: names, shapes,
        dtypes (the state's are every tensor sent, the update's the parameters sent), finite values of a sane
        magnitude in both, a sample count of 1 to the partition's training samples)."""
        try:
            state, delta = task.from_record(content["arrays"]), task.from_record(content["update"])
        except Exception as err:  # noqa: BLE001 - whatever a node sent that is not arrays
            raise ReplyProblem(f"its arrays cannot be read ({type(err).__name__})") from None
        count, most = content["metrics"].get("num-examples"), self.train_samples[partition]
        # The update is the node's own word, scored as it is: it is held to the same bound as the trained
        # arrays (a movement no training makes would overflow the scores' sums of squares).
        problem = (update_problem(state, self._sent_spec, count, most, limit=self._sent_limit)
                   or update_problem(delta, self._update_spec, count, most, limit=self._sent_limit))
        if problem:
            raise ReplyProblem(problem)
        return {"partition": partition, "state": state, "delta": delta, "count": int(count)}

    def _read_evaluate(self, partition: int, content: RecordDict) -> dict:
        """An evaluation reply's test counts (0 <= correct <= num-examples <= the partition's test samples),
        AUC (in [0, 1]) and train loss (a finite sum >= 0 over 0 to the partition's training samples)."""
        metrics = content["metrics"]
        examples = _count(metrics, "num-examples", self.test_samples[partition], "the test samples it holds")
        correct = _count(metrics, "correct", examples, "its num-examples")
        # The project's AUC of an empty test set is NaN (nothing to rank): accepted from such a reply alone, and
        # summarised as main.py's evaluation summarises it.
        auc = _number(metrics, "auc", 1.0, nan=examples == 0)
        loss = _number(metrics, "train-loss-sum")
        train = _count(metrics, "train-samples", self.train_samples[partition], "the training samples it holds")
        return {"partition": partition, "test": ClientTestStats(correct, examples, auc), "loss": loss,
                "train": train}


# What a reply that fails a check is left out of.
_USE = {"train": "scores and the average", "evaluate": "evaluation"}


class ReplyProblem(ValueError):
    """Why a node's reply is not used this round: that node's failure for the round."""


def _present(metrics: MetricRecord, key: str):
    value = metrics.get(key)
    if value is None:
        raise ReplyProblem(f"it carries no {key}")
    return value


def _count(metrics: MetricRecord, key: str, most: int, what: str) -> int:
    """``metrics[key]``: a whole number in [0, most] (``what`` names ``most`` in the problem)."""
    value = _present(metrics, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ReplyProblem(f"its {key} {value!r} is not a whole number >= 0")
    if value > most:
        raise ReplyProblem(f"its {key} {value} is above {what} ({most})")
    return value


def _number(metrics: MetricRecord, key: str, most: float = math.inf, nan: bool = False) -> float:
    """``metrics[key]``: a finite number in [0, most], or NaN where ``nan`` allows it."""
    value = _present(metrics, key)
    number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if number is None or not ((nan and math.isnan(number)) or (math.isfinite(number) and 0 <= number <= most)):
        bound = f"in [0, {most:g}]" if math.isfinite(most) else ">= 0"
        raise ReplyProblem(f"its {key} {value!r} is not a finite number {bound}")
    return number
