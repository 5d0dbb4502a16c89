"""Many clients evaluated at once: what :meth:`~flcore.clients.clientbase.Client.test_metrics` and
``train_metrics`` compute client by client (test accuracy and AUC, summed train loss), with one vmapped
eval-mode forward per chunk of every client's rows, from each split gathered on the device once
(:class:`~flcore.vmapped.stacking.StackedData`).

The chunks are the sequential ones (``EVAL_BATCH_SIZE`` rows of each client, in order) and the losses
are summed chunk by chunk in float64 as there, so the results differ from the sequential ones only by the
rounding of the batched products: the same tolerance as batched training.
"""
from __future__ import annotations

from itertools import chain
from typing import List, Sequence

import torch
from torch import nn
from torch.func import vmap

from flcore.vmapped.functional import FunctionalNet
from flcore.vmapped.stacking import StackedData, StackedModels
from flcore.clients.clientbase import EVAL_BATCH_SIZE, Client
from utils.metrics import ClientEvaluation, test_stats

# Rows of all clients in one forward: a bound on the activations held at once (16 clients' chunks).
ROWS_PER_FORWARD = 16 * EVAL_BATCH_SIZE


def evaluates_as_base(client_class: type) -> bool:
    """Whether the class keeps the base client's evaluation (a model's outputs on the rows, argmax)."""
    return all(getattr(client_class, name) is getattr(Client, name)
               for name in ("test_metrics", "train_metrics", "_predict"))


def same_structure(models: Sequence[nn.Module]) -> bool:
    """Whether the models can be stacked: one class, the same tensors by name, shape and dtype."""
    def structure(model: nn.Module):
        tensors = chain(model.named_parameters(), model.named_buffers())
        return type(model), [(name, t.shape, t.dtype) for name, t in tensors]
    first = structure(models[0])
    return all(structure(model) == first for model in models[1:])


@torch.inference_mode()
def evaluate_group(clients: Sequence, models: Sequence[nn.Module], net: FunctionalNet, test: StackedData,
                   train: StackedData, everyone: Sequence = ()) -> List[ClientEvaluation]:
    """Each client's test accuracy and AUC and its summed train loss, for ``models[i]`` on ``clients[i]``'s
    data (every client holds at least one row of each split)."""
    for model in models:
        model.eval()  # as test_metrics leaves it
    stacked = StackedModels(models)
    test_outputs = _outputs(stacked, net, test, clients, everyone)
    train_outputs = _outputs(stacked, net, train, clients, everyone)
    results = []
    for client, test_logits, train_logits in zip(clients, test_outputs, train_outputs):
        labels = client.train_data.y
        total = torch.zeros((), dtype=torch.float64, device=labels.device)
        for start in range(0, len(labels), EVAL_BATCH_SIZE):
            rows = slice(start, start + EVAL_BATCH_SIZE)
            total += nn.functional.cross_entropy(train_logits[rows], labels[rows], reduction="sum").double()
        results.append(ClientEvaluation(test_stats(test_logits, client.test_data.y), float(total),
                                        client.train_samples))
    return results


def _outputs(stacked: StackedModels, net: FunctionalNet, data: StackedData, clients: Sequence,
             everyone: Sequence) -> List[torch.Tensor]:
    """Each client's model outputs on every row of its split of ``data``, in row order."""
    offsets = data.offsets(clients, everyone)
    sizes = [len(getattr(c, data.split)) for c in clients]
    # Largest first: the clients that still have rows at a chunk are a prefix of the stacked rows.
    order = sorted(range(len(clients)), key=lambda i: -sizes[i])
    position = torch.tensor(order, device=data.y.device)
    params = {name: p.index_select(0, position) for name, p in stacked.params.items()}
    buffers = {name: b.index_select(0, position) for name, b in stacked.buffers.items()}
    first = torch.tensor([offsets[i] for i in order], device=data.y.device)
    last = torch.tensor([sizes[i] - 1 for i in order], device=data.y.device)
    forward = vmap(lambda p, b, x: net.run(x, p, b, training=False))
    per_forward = max(1, ROWS_PER_FORWARD // EVAL_BATCH_SIZE)
    pieces: List[List[torch.Tensor]] = [[] for _ in clients]
    for start in range(0, sizes[order[0]], EVAL_BATCH_SIZE):
        active = sum(1 for i in order if sizes[i] > start)
        width = min(EVAL_BATCH_SIZE, sizes[order[0]] - start)
        rows = torch.arange(start, start + width, device=data.y.device)
        for a in range(0, active, per_forward):
            b = min(a + per_forward, active)
            # A client with fewer rows left repeats its last row; those outputs are dropped below.
            index = first[a:b, None] + torch.minimum(rows[None, :], last[a:b, None])
            out = forward({n: p[a:b] for n, p in params.items()}, {n: t[a:b] for n, t in buffers.items()},
                          data.inputs(index))
            for j in range(b - a):
                client = order[a + j]
                pieces[client].append(out[j, :min(width, sizes[client] - start)])
    return [torch.cat(p) for p in pieces]
