"""One group of clients trained together: what each client's ``train()`` does, with every SGD step of
every client of the group taken as one vmapped forward/backward.

Per client, in ``train()``'s order: ``model.train()`` and ``begin_local_training()`` on the client
object; the stages of its :class:`~flcore.vmapped.support.Recipe` on the stacked models; the trained
values written back into the client's own tensors; under ``-ld`` its schedulers stepped; then
``end_local_training()``. A step is ``w <- w - lr * grad`` of the clients' common ``objective``
(the one ``local_loss`` runs sequentially, here on a :class:`~flcore.vmapped.view.FunctionalModel`):
SGD without momentum or weight decay, the only optimiser accepted, the learning rate read from the
client's own optimiser.
"""
from __future__ import annotations

import warnings
from typing import List, Sequence, Tuple

import torch
from torch.func import grad_and_value, vmap

from flcore.vmapped.functional import FunctionalNet
from flcore.vmapped.schedule import BatchPlan
from flcore.vmapped.stacking import StackedData, StackedModels, Tensors, stack_dicts
from flcore.vmapped.support import Recipe, Stage
from flcore.vmapped.view import FunctionalModel, round_inputs
from flcore.training.objective import Objective


class EngineError(RuntimeError):
    """A client the declarations admit, in a state the engine cannot reproduce (e.g. another optimiser)."""


def sgd_problem(optimizer) -> str:
    """Why ``optimizer`` is not plain SGD (the update the engine applies), or ''."""
    if type(optimizer) is not torch.optim.SGD:
        return f"its optimiser is {type(optimizer).__name__}, not SGD"
    if len(optimizer.param_groups) != 1:
        return "its optimiser has several parameter groups"
    group = optimizer.param_groups[0]
    for key in ("momentum", "weight_decay"):
        if group.get(key, 0):
            return f"its SGD has {key} {group[key]}"
    if group.get("nesterov") or group.get("maximize"):
        return "its SGD uses nesterov or maximize"
    if isinstance(group["lr"], torch.Tensor):
        return "its learning rate is a tensor"
    return ""


def trained_names(client, optimizer) -> Tuple[str, ...]:
    """The parameters of ``client.model`` a sequential stage with ``optimizer`` changes: those it holds
    that require gradients."""
    problem = sgd_problem(optimizer)
    held = {id(p) for p in optimizer.param_groups[0]["params"]}
    names = tuple(n for n, p in client.model.named_parameters() if id(p) in held)
    if not problem and len(names) != len(held):
        problem = "its optimiser holds tensors outside its model"
    if problem:
        raise EngineError(f"client {client.id} cannot train batched: {problem}")
    return tuple(n for n in names if client.model.get_parameter(n).requires_grad)


def _same(values: Sequence, what: str):
    distinct = set(values)
    if len(distinct) != 1:
        shown = ", ".join(sorted(map(repr, distinct)))  # repr: objectives have no order of their own
        raise EngineError(f"clients trained together need one {what}, got [{shown}]")
    return values[0]


def per_client_loss(objective: Objective, net: FunctionalNet):
    """``objective`` as a function of one client's (parameters, buffers, round inputs, x, y), to vmap."""
    def loss(params: Tensors, buffers: Tensors, extras: Tensors, x: torch.Tensor, y: torch.Tensor):
        return objective(FunctionalModel(net, params, buffers, extras), x, y)
    return loss


def train_group(clients: Sequence, recipe: Recipe, net: FunctionalNet, data: StackedData,
                everyone: Sequence = (), keep_grads: bool = False) -> List[int]:
    """Train ``clients`` (in :func:`~flcore.vmapped.schedule.order_key` order) as their ``train()`` would.

    Returns the ids of the clients whose loss was not finite in the stage where that first happened
    (their state is written back and nothing after that stage runs, as ``run_epochs`` raises there);
    an empty list when training completed. ``keep_grads``: leave each trained parameter's last
    minibatch gradient in ``.grad``, as a sequential run does.
    """
    for client in clients:
        client.model.train()
        client.begin_local_training()
    models = [c.model for c in clients]
    stacked = StackedModels(models)
    # Hyper-parameters are the objective's fields: equal objectives, one vmapped step.
    objective = _same([c.objective for c in clients], "objective")
    loss = per_client_loss(objective, net)
    extras = stack_dicts([round_inputs(objective, c) for c in clients])
    offsets = data.offsets(clients, everyone)
    for stage in recipe.stages:
        diverged = _run_stage(clients, stage, stacked, loss, extras, data, offsets, keep_grads)
        if diverged:
            stacked.write_back(models)
            return diverged
    stacked.write_back(models)
    for client in clients:
        if client.learning_rate_decay:
            with warnings.catch_warnings():
                # The optimiser's step() never ran: the engine updates the tensors itself.
                warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
                for name in recipe.schedulers:
                    getattr(client, name).step()
        client.end_local_training()
    return []


def _run_stage(clients, stage: Stage, stacked: StackedModels, loss, extras: Tensors, data: StackedData,
               offsets: Sequence[int], keep_grads: bool) -> List[int]:
    optimizers = [getattr(c, stage.optimizer) for c in clients]
    trained = _same([trained_names(c, o) for c, o in zip(clients, optimizers)], "set of trained parameters")
    epochs = _same([int(getattr(c, stage.epochs)) for c in clients], stage.epochs)
    batch_size = _same([int(c.batch_size) for c in clients], "batch size")
    rates = [float(o.param_groups[0]["lr"]) for o in optimizers]
    device = data.y.device
    plan = BatchPlan(clients, epochs, batch_size, offsets, device)
    if plan.num_steps == 0:  # -ls 0 (or -pls 0): no batch drawn, nothing changes
        return []
    if not trained:
        raise EngineError("a stage whose optimiser trains no parameter cannot run (its backward pass fails "
                          "sequentially too)")
    frozen = [n for n in stacked.param_names if n not in trained]

    def trained_loss(train: Tensors, fixed: Tensors, buffers: Tensors, extra: Tensors, x, y):
        return loss({**fixed, **train}, buffers, extra, x, y)

    step = vmap(grad_and_value(trained_loss))
    uniform = len(set(rates)) == 1
    rate_column = torch.tensor(rates, dtype=stacked.params[trained[0]].dtype, device=device)
    nonfinite = torch.zeros(len(clients), dtype=torch.bool, device=device)
    last = {n: torch.zeros_like(stacked.params[n]) for n in trained} if keep_grads else {}
    for t in range(plan.num_steps):
        for a, b, size in plan.groups(t):
            index = plan.index[t, a:b, :size]
            grads, values = step({n: stacked.params[n][a:b] for n in trained},
                                 {n: stacked.params[n][a:b] for n in frozen},
                                 {n: stacked.buffers[n][a:b] for n in stacked.buffer_names},
                                 {k: v[a:b] for k, v in extras.items()},
                                 data.inputs(index), data.y[index])
            nonfinite[a:b] |= ~torch.isfinite(values.detach())
            with torch.no_grad():
                targets = [stacked.params[n][a:b] for n in trained]
                updates = [grads[n] for n in trained]
                if uniform:
                    torch._foreach_add_(targets, updates, alpha=-rates[0])
                else:
                    column = rate_column[a:b]
                    for target, update in zip(targets, updates):
                        target.sub_(update * column.view(-1, *([1] * (update.dim() - 1))))
                for n in last:
                    last[n][a:b].copy_(grads[n])
    if last:
        stacked.set_grads([c.model for c in clients], last, [i for i, s in enumerate(plan.steps) if s > 0])
    flags = nonfinite.tolist()
    return [c.id for c, bad in zip(clients, flags) if bad]

