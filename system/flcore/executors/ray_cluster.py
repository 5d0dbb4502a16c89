"""The selected clients train in parallel on Ray actors (``--executor ray``), on this machine or a cluster."""
from __future__ import annotations

import os
import pickle
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from torch import nn

from flcore.clients.clientbase import Client
from flcore.clients.parked_modules import ModuleTemplate
from flcore.exchange import ClientUpdate
from flcore.executors.client_worker import ClientWorker, worker_arguments
from flcore.executors.sequential import evaluate_in_turn
from flcore.executors.shipping import ship
from utils import progress
from utils.errors import RunError
from utils.metrics import ClientEvaluation
from utils.paths import REPO_ROOT, SYSTEM_DIR


class RayExecutor:
    """Selected clients train in parallel on ``workers`` Ray actors; client i always goes to worker
    ``i % workers``, so each worker reads a client's data once and keeps it.

    A worker that dies (its process killed, its node lost) is replaced by a new actor, and the clients
    it had not returned are trained again there. That gives the same result as an uninterrupted run:
    a worker only ever gets a copy, and the server's client objects change only once every client of
    the round is back, so a client re-sent is exactly the client first sent (model, optimiser,
    generator). A worker that returns nothing for ``timeout`` seconds, a client whose workers died
    :data:`RETRIES` + 1 times, or a cluster with no live node left, stop the run with a
    :class:`~flcore.servers.serverbase.RunError` that says what to do (the server then keeps the
    results so far).
    """

    RETRIES = 2  # new actors tried per client and round after the first one died

    def __init__(self, server, workers: int, address: str = "", gpus_per_worker: float = 0.0,
                 timeout: float = 0.0):
        import ray
        self.ray = ray
        self.timeout = timeout
        self.gpus_per_worker = gpus_per_worker
        self.started_here = start_ray(address, timeout)
        self.actor_class = ray.remote(num_cpus=1, num_gpus=gpus_per_worker)(ClientWorker)
        self.actor_args = worker_arguments(server)
        self.workers = [self._new_actor() for _ in range(workers)]
        self.templates: List[ModuleTemplate] = []  # every template so far, in the order the workers hold them
        self.round_key = 0
        self.given: Dict[int, Tuple[int, int]] = {}  # id(actor) -> (round it holds, templates it holds)
        self.sent_bytes = {"shared": 0, "clients": 0, "tables": 0}  # the last round's (benchmarks/ray_speedup.py)

    def _new_actor(self):
        return self.actor_class.remote(*self.actor_args)

    def pids(self) -> List[int]:
        """The workers' process ids (the processes doing the training), in worker order; waits for
        workers still starting."""
        return self.ray.get([w.pid.remote() for w in self.workers])

    def train(self, clients: Sequence[Client]) -> List[ClientUpdate]:
        ray = self.ray
        lost_errors = (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError,
                       ray.exceptions.NodeDiedError, ray.exceptions.ObjectLostError)
        pending: Dict[object, tuple] = {}  # object ref -> (client, worker slot, the actor it went to)
        retries = {c.id: 0 for c in clients}
        trained: Dict[int, Tuple[dict, ClientUpdate]] = {}
        # The round's shared tensors travel once to each worker, not once per client (executors/shipping.py).
        table, packed = ship(clients, self.templates)
        self.round_key += 1
        tensors = pickle.dumps(table.tensors, protocol=pickle.HIGHEST_PROTOCOL)
        packed_of = {client.id: blob for client, blob in zip(clients, packed)}
        self.sent_bytes = {"shared": 0, "clients": 0, "tables": 0}

        def submit(client: Client) -> None:
            slot = client.id % len(self.workers)
            actor = self.workers[slot]
            given = self.given.get(id(actor), (-1, 0))
            if given[0] != self.round_key:
                templates = None if given[1] == len(self.templates) else pickle.dumps(self.templates)
                actor.hold.remote(self.round_key, tensors, templates)
                self.given[id(actor)] = (self.round_key, len(self.templates))
                self.sent_bytes["shared"] += len(tensors)
                self.sent_bytes["tables"] += 1
            pending[actor.train.remote(packed_of[client.id], self.round_key)] = (client, slot, actor)
            self.sent_bytes["clients"] += len(packed_of[client.id])

        for client in clients:
            submit(client)
        progress.current().begin("train", len(clients))
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=self.timeout or None)
            if not done:
                waiting = sorted(c.id for c, _, _ in pending.values())
                raise RunError(
                    f"no Ray worker returned a client for {self.timeout:g} s (--ray_timeout); still waiting for "
                    f"clients {_id_list(waiting)}. A worker is stuck (stopped process, lost node) or the cluster "
                    f"cannot place {len(self.workers)} workers x {self.gpus_per_worker:g} GPUs; if local training "
                    f"is simply that slow, raise --ray_timeout (0 waits forever)")
            client, slot, actor = pending.pop(done[0])
            try:
                trained[client.id] = table.loads(ray.get(done[0]))
                progress.current().advance()
            except ray.exceptions.RayTaskError as err:
                # Surface the worker's own exception (e.g. DivergenceError) rather than Ray's wrapper.
                raise (err.cause if isinstance(err.cause, Exception) else err) from None
            except lost_errors as err:
                retries[client.id] += 1
                if retries[client.id] > self.RETRIES:
                    raise RunError(
                        f"the Ray worker training client {client.id} died {retries[client.id]} times "
                        f"({type(err).__name__}); the client may exhaust the worker's memory (see Ray's logs "
                        f"under the session's logs/ folder), or use --executor sequential") from None
                if self.workers[slot] is actor:  # the first of that actor's lost clients: replace it once
                    self._replace(slot)
                submit(client)
        # Only now, with every client back, does the server's state change (see the class docstring).
        for client in clients:
            client.set_state(trained[client.id][0])
            client.park()
        return [trained[client.id][1] for client in clients]

    def evaluate_clients(self, clients: Sequence[Client],
                         model_of: Optional[Callable[[Client], nn.Module]] = None) -> List[ClientEvaluation]:
        """In the driver, which holds every client's state between rounds."""
        return evaluate_in_turn(clients, model_of)

    def _replace(self, slot: int) -> None:
        """Put a new actor in ``slot``, refusing when the cluster has no live node to place it on."""
        try:
            self.ray.kill(self.workers[slot], no_restart=True)
        except Exception:  # noqa: BLE001 - already gone: nothing to stop
            pass
        try:
            alive = any(node.get("Alive") for node in self.ray.nodes())
        except Exception as err:  # noqa: BLE001 - the cluster's head itself is gone
            raise RunError(f"the Ray cluster's head cannot be reached ({type(err).__name__}), so the lost "
                           "worker cannot be replaced; restart Ray and run again, with --resume if checkpoints "
                           "were written") from None
        if not alive:
            raise RunError("every node of the Ray cluster is dead (its raylet was stopped or crashed), so the "
                           "lost worker cannot be replaced; restart Ray (or leave --ray_address empty for a "
                           "local one) and run again, with --resume if checkpoints were written")
        self.given.pop(id(self.workers[slot]), None)
        self.workers[slot] = self._new_actor()

    def close(self) -> None:
        for worker in self.workers:
            try:
                self.ray.kill(worker, no_restart=True)
            except Exception:  # noqa: BLE001 - a worker already lost needs no stopping
                pass
        self.workers = []
        if self.started_here and self.ray.is_initialized():
            self.ray.shutdown()


def _id_list(ids: Sequence[int], limit: int = 10) -> str:
    shown = ", ".join(str(i) for i in ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def check_reachable(address: str, timeout: float) -> None:
    """Refuse at once a ``host:port`` (or ``ray://host:port``) where nothing listens: ``ray.init`` would
    otherwise retry for minutes. ``auto`` and '' are left to Ray."""
    import socket
    if address in ("", "auto", "local"):
        return
    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise RunError(f"--ray_address {address!r} is not host:port (e.g. 10.0.0.1:6379), 'auto' or ''")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=min(timeout or 10.0, 10.0)):
            pass
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise RunError(f"cannot reach a Ray cluster at --ray_address {address} ({reason}); start one there "
                       f"(ray start --head --port {port}), fix the address, or leave --ray_address empty "
                       f"to start a local Ray") from None


def start_ray(address: str = "", timeout: float = 0.0) -> bool:
    """Connect to (``address``) or start a Ray cluster able to import the project; False if already up.

    Raises the project's RunError when the cluster cannot be reached."""
    import ray
    if ray.is_initialized():
        return False
    check_reachable(address, timeout)
    # Ray hides the GPUs from a worker given zero of them; keep them visible, as a worker that asks for
    # none needs none (and this silences Ray's warning about a future change of that default).
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    # Workers import the project's modules to rebuild clients; on a cluster every node needs the
    # repository (and the data) at the same path, e.g. on a shared filesystem.
    env = {"PYTHONPATH": f"{SYSTEM_DIR}:{REPO_ROOT}"}
    try:
        ray.init(address=address or None, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": env}, configure_logging=False)
    except (ConnectionError, TimeoutError, RuntimeError) as err:
        if ray.is_initialized():
            ray.shutdown()
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        what = f"join the Ray cluster at --ray_address {address}" if address else "start a local Ray"
        raise RunError(f"could not {what} ({first}); check the address, or leave --ray_address empty to "
                       "start a local Ray") from None
    return True
