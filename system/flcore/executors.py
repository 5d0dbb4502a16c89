"""How the selected clients of a round are trained: one after another, or on a pool of Ray workers.

The server owns every client's state between rounds. An executor only runs ``client.train()``
somewhere and brings the trained state back into the server's client object, in place (so live
references such as ``uploaded_models`` and optimiser parameter lists stay valid). A client's training
depends only on its own state (model, optimiser, generator, algorithm attributes) and its data, so
results do not depend on the executor or on the number of workers - provided every worker uses as
many intra-op threads as the driver (float reductions differ between 1 and 2 threads), which the Ray
executor enforces.
"""
from __future__ import annotations

import copy
from typing import Dict, List, Sequence

import torch
from torch import nn

from flcore.clients.clientbase import Client
from utils.data_utils import DatasetInfo, load_client_data
from utils.paths import REPO_ROOT, SYSTEM_DIR

EXECUTORS = ("sequential", "ray")
_DATA_ATTRS = ("train_data", "test_data")


class SequentialExecutor:
    """PFLlib's behaviour: the selected clients train one after another in this process."""

    def train(self, clients: Sequence[Client]) -> None:
        for client in clients:
            client.train()

    def close(self) -> None:
        pass


def without_data(client: Client) -> Client:
    """A shallow copy of ``client`` with its data detached: what travels to a worker."""
    shipped = copy.copy(client)
    for name in _DATA_ATTRS:
        setattr(shipped, name, None)
    return shipped


def merge_trained(local: Client, trained: Client) -> None:
    """Copy a trained client's state into the server's object, keeping the server's objects' identity."""
    for name, value in vars(trained).items():
        if name in _DATA_ATTRS:
            continue
        current = getattr(local, name, None)
        if isinstance(current, nn.Module) and type(current) is type(value):
            current.load_state_dict(value.state_dict())
            # The last minibatch's gradients are part of the result (FedLAG's last_batch signal).
            for mine, theirs in zip(current.parameters(), value.parameters()):
                mine.grad = None if theirs.grad is None else theirs.grad.to(mine.device)
        elif isinstance(current, (torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)):
            current.load_state_dict(value.state_dict())
        elif isinstance(current, torch.Generator):
            current.set_state(value.get_state())
        elif isinstance(current, torch.Tensor) and isinstance(value, torch.Tensor) \
                and current.shape == value.shape and current.dtype == value.dtype:
            with torch.no_grad():
                current.copy_(value)
        else:
            setattr(local, name, value)


class _ClientWorker:
    """A Ray actor: loads each client's data once, then trains whatever client state it is sent."""

    def __init__(self, info: DatasetInfo, device: str, num_classes: int, few_shot: int, channels_last: bool,
                 threads: int):
        torch.set_num_threads(threads)
        self.info, self.device = info, torch.device(device)
        self.num_classes, self.few_shot, self.channels_last = num_classes, few_shot, channels_last
        self.data: Dict[int, tuple] = {}

    def _client_data(self, client_id: int) -> tuple:
        if client_id not in self.data:
            load = lambda split, shots: load_client_data(  # noqa: E731
                self.info, client_id, split, self.device, num_classes=self.num_classes, few_shot=shots,
                channels_last=self.channels_last)
            self.data[client_id] = (load("train", self.few_shot), load("test", 0))
        return self.data[client_id]

    def train(self, client: Client) -> Client:
        client.train_data, client.test_data = self._client_data(client.id)
        client.train()
        return without_data(client)


class RayExecutor:
    """Selected clients train in parallel on ``workers`` Ray actors; client i always goes to worker
    ``i % workers``, so each worker reads a client's data once and keeps it."""

    def __init__(self, server, workers: int, address: str = "", gpus_per_worker: float = 0.0):
        import ray
        self.ray = ray
        self.started_here = start_ray(address)
        actor = ray.remote(num_cpus=1, num_gpus=gpus_per_worker)(_ClientWorker)
        args = server.args
        channels_last = server.clients[0].train_data.x.is_contiguous(memory_format=torch.channels_last) \
            and not server.clients[0].train_data.x.is_contiguous()
        self.workers = [actor.remote(server.data_info, str(server.device), args.num_classes, args.few_shot,
                                     channels_last, torch.get_num_threads()) for _ in range(workers)]

    def train(self, clients: Sequence[Client]) -> None:
        futures = [self.workers[c.id % len(self.workers)].train.remote(without_data(c)) for c in clients]
        try:
            trained: List[Client] = self.ray.get(futures)
        except self.ray.exceptions.RayTaskError as err:
            # Surface the worker's own exception (e.g. DivergenceError) rather than Ray's wrapper.
            raise (err.cause if isinstance(err.cause, Exception) else err) from None
        for local, result in zip(clients, trained):
            merge_trained(local, result)

    def close(self) -> None:
        for worker in self.workers:
            self.ray.kill(worker)
        self.workers = []
        if self.started_here and self.ray.is_initialized():
            self.ray.shutdown()


def start_ray(address: str = "") -> bool:
    """Connect to (``address``) or start a Ray cluster able to import the project; False if already up."""
    import os
    import ray
    if ray.is_initialized():
        return False
    # Keep today's behaviour (and silence Ray's warning about a future change of this default).
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    # Workers import the project's modules to rebuild clients; on a cluster every node needs the
    # repository (and the data) at the same path, e.g. on a shared filesystem.
    env = {"PYTHONPATH": f"{SYSTEM_DIR}:{REPO_ROOT}"}
    ray.init(address=address or None, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": env}, configure_logging=False)
    return True


def make_executor(server, args):
    kind = getattr(args, "executor", "sequential")
    if kind == "sequential":
        return SequentialExecutor()
    if kind == "ray":
        return RayExecutor(server, args.workers, args.ray_address, args.gpus_per_worker)
    raise ValueError(f"unknown executor {kind!r}; choose one of {', '.join(EXECUTORS)}")
