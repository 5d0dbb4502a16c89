"""FedLAG's ClientApp: the project's own client, trained by its own ``train()``, on one SuperNode.

Runs where a SuperNode runs (a Ray actor in simulation, a ``flwr-clientapp`` process in deployment).
Every message is handled the same way:

1. build the project's client for this node's partition (``partition-id``); the partition's data is
   read once per process and cached;
2. restore the client's state from ``context.state`` (the node's own memory across rounds): its whole
   local model, optimiser, learning-rate scheduler and batch-order generator (``Client.get_state()``);
3. overwrite the model with the received global arrays, except the personal layers the server names
   in ``config["lag-personal"]`` (and their modules' buffers): those keep the node's own values, but for
   the tensors ``config["lag-group"]`` names (``--lag_share groups``: its group's model of a personal
   layer, which the arrays carry).

The whole local model is kept, not only the current personal layers, because the personal set for the
next round is chosen only after this round's uploads; whichever layers it names, the node still holds
its own last trained copy of them. A node that never trained starts from the global model, personal
layers included (the server's average is for exactly such clients).

``train`` replies with the trained arrays (``arrays``), the update ``theta_after - theta_start`` of
every parameter (``update``, which the server scores), and ``num-examples``. ``evaluate`` replies with
the project's test counts, AUC and train loss, measured after the broadcast as in every other method.
With ``dump-dir`` set, the node also writes the model it holds after each step to
``<dump-dir>/node<partition>_round<r>_<train|evaluate>.npz`` (used by the tests).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from . import task

STATE_KEY = "pfl-client"  # ConfigRecord in context.state: {"state": torch.save(Client.get_state())}

app = ClientApp()


def _prepare(msg: Message, context: Context):
    """Steps 1-3 of the module docstring: a client holding the broadcast plus its own personal layers."""
    client = task.build_client(context)  # puts the project on sys.path first
    from flcore.aggregation import copy_into, named_tensors
    from flcore.lag.conflict import with_module_buffers

    stored = context.state.get(STATE_KEY)
    if stored is not None:
        client.set_state(task.state_from_bytes(stored["state"]))
    received = task.from_record(msg.content["arrays"])
    config = msg.content["config"]
    # A node with nothing of its own yet starts from the server's model, averaged personal layers included.
    personal = task.names_from_config(config.get("lag-personal")) if stored is not None else []
    keep = set(with_module_buffers(client.model, personal))  # as LayerConflictMixin keeps them
    keep -= set(task.names_from_config(config.get("lag-group")))  # what its group shares: received
    unknown = set(received) - set(named_tensors(client.model))
    if unknown:
        raise task.SetupError(f"the server sent tensors this model does not have: {sorted(unknown)[:5]}")
    copy_into(client.model, received, [n for n in received if n not in keep])
    return client, int(config.get("server-round", 0))


def _dump(context: Context, client, rnd: int, phase: str) -> None:
    folder = task.setting(context, "dump-dir", "")
    if not folder:
        return
    from dataset.utils.atomic_io import atomic_path  # the project is on sys.path once a client is built
    path = Path(str(folder)) / f"node{client.id}_round{rnd}_{phase}.npz"
    state = {name: t.detach().cpu().numpy() for name, t in client.model.state_dict().items()}
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:  # a file object: np.savez adds no suffix
        np.savez(fh, **state)


@app.train()
def train(msg: Message, context: Context) -> Message:
    client, rnd = _prepare(msg, context)
    start = {name: p.detach().clone() for name, p in client.model.named_parameters()}
    update = client.train()  # the project's local training loop, unchanged, and its ClientUpdate
    delta = {name: t - start[name] for name, t in update.tensors.items() if name in start}
    context.state[STATE_KEY] = ConfigRecord({"state": task.state_to_bytes(client.get_state())})
    _dump(context, client, rnd, "train")
    metrics = MetricRecord({"num-examples": update.num_samples, "partition-id": update.client_id})
    content = RecordDict({"arrays": task.to_record(update.tensors),
                          "update": task.to_record(delta), "metrics": metrics})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    client, rnd = _prepare(msg, context)
    stats = client.test_metrics()
    loss_sum, train_samples = client.train_metrics()
    _dump(context, client, rnd, "evaluate")
    metrics = MetricRecord({"num-examples": stats.num_samples, "correct": stats.correct, "auc": stats.auc,
                            "train-loss-sum": loss_sum, "train-samples": train_samples,
                            "partition-id": client.id})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
