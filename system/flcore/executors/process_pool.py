"""Clients train, and are evaluated, in parallel on worker processes of this machine (``--executor
processes``, and what ``--executor auto`` picks where cores are free: :mod:`app.cores`).

Standard library only (``multiprocessing``): on Linux with the CPU, workers are forked, as torch's own
DataLoader workers are (they start at once, with the project's modules loaded); elsewhere, or with a GPU
(which a forked process cannot use), spawned. Each worker is a :class:`~.client_worker.ClientWorker`
behind a pipe. What
crosses is what crosses to Ray's workers (:mod:`.shipping`): the shared tensors once per worker and
batch of clients, the templates once per run, and each client's own tensors. The largest clients go first,
each to the first worker free, so one big client does not hold up a round; which worker takes which
client changes nothing, since every worker has the server's thread count and a client's training depends
only on its state and its data. The server's client objects change only once every client is back.

Not the same bits as in turn: a model that draws dropout masks from torch's global generator, since each
worker has its own (:func:`draws_global_randomness`; ``--executor auto`` then stays in one process).
"""
from __future__ import annotations

import multiprocessing
import pickle
import signal
import sys
from multiprocessing.connection import wait
from typing import Callable, Dict, List, Optional, Sequence

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


def draws_global_randomness(model: nn.Module) -> bool:
    """Whether training ``model`` draws from torch's global generator (dropout, a recurrent layer's
    dropout between layers), which a worker process does not share with the server's."""
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0
               or isinstance(m, nn.RNNBase) and m.dropout > 0 for m in model.modules())


def start_method(device: str) -> str:
    """``fork`` on Linux with the CPU, else ``spawn``."""
    return "fork" if sys.platform.startswith("linux") and device == "cpu" else "spawn"


def _serve(connection, arguments: tuple) -> None:
    """A worker process: answer each ``(method, args, table)`` with ``("ok", reply)`` or ``("error",
    exception)`` until told to stop (None) or the server is gone; ``table``, when not None, is
    :meth:`~ClientWorker.hold`'s arguments, to take first."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the server decides
    for stop in (signal.SIGTERM, signal.SIGHUP):  # a forked worker inherits the server's handlers
        signal.signal(stop, signal.SIG_DFL)
    worker = ClientWorker(*arguments)
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        method, args, table = message
        try:
            if table is not None:
                worker.hold(*table)
            reply = ("ok", getattr(worker, method)(*args))
        except Exception as err:  # noqa: BLE001 - raised again in the server, as training there would
            reply = ("error", _picklable(err))
        connection.send(reply)


def _picklable(err: Exception) -> Exception:
    try:
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:  # noqa: BLE001 - an exception with arguments pickle cannot rebuild
        return RuntimeError(f"{type(err).__name__}: {err}")


class _Worker:
    """One worker process and the server's end of its pipe; ``holds`` says which table and how many of
    the run's templates it has."""

    def __init__(self, context, arguments: tuple, index: int):
        self.connection, theirs = context.Pipe()
        self.process = context.Process(target=_serve, args=(theirs, arguments), daemon=True,
                                       name=f"client-worker-{index}")
        self.process.start()
        theirs.close()
        self.index, self.holds = index, (-1, 0)


class ProcessExecutor:
    """``workers`` processes of this machine train the selected clients and evaluate clients (in the
    server's process only with ``model_of``, e.g. Ditto's global model, which names no client state)."""

    def __init__(self, server, workers: int):
        context = multiprocessing.get_context(start_method(str(server.device)))
        arguments = worker_arguments(server)
        sys.stdout.flush()  # a forked worker must not write the server's buffered lines again
        sys.stderr.flush()
        self.workers = [_Worker(context, arguments, index) for index in range(workers)]
        self.templates: List[ModuleTemplate] = []  # every template so far, in the order workers hold them
        self.key = 0

    def train(self, clients: Sequence[Client]) -> List[ClientUpdate]:
        progress.current().begin("train", len(clients))
        table, replies = self._run("train", clients, [c.train_samples for c in clients])
        trained = [table.loads(reply) for reply in replies]
        # Only now, with every client back, does the server's state change.
        for client, (state, _) in zip(clients, trained):
            client.set_state(state)
            client.park()
        return [update for _, update in trained]

    def evaluate_clients(self, clients: Sequence[Client],
                         model_of: Optional[Callable[[Client], nn.Module]] = None) -> List[ClientEvaluation]:
        if model_of is not None:
            return evaluate_in_turn(clients, model_of)
        _, replies = self._run("evaluate", clients, [c.train_samples + c.test_samples for c in clients])
        return [pickle.loads(reply) for reply in replies]

    def _run(self, method: str, clients: Sequence[Client], sizes: Sequence[int]):
        """``method`` of every client on the workers, largest first, each to the first one free; the
        batch's table and the replies in the clients' order."""
        table, packed = ship(clients, self.templates)
        self.key += 1
        tensors = pickle.dumps(table.tensors, protocol=pickle.HIGHEST_PROTOCOL)
        waiting = sorted(range(len(clients)), key=lambda i: (-sizes[i], i))
        replies: Dict[int, bytes] = {}
        busy: Dict[int, int] = {}  # worker index -> the client (position) it has

        def give(worker: _Worker) -> None:
            position = waiting.pop(0)
            hold = None  # the batch's shared tensors (and new templates), for a worker's first client of it
            if worker.holds[0] != self.key:
                templates = None if worker.holds[1] == len(self.templates) else pickle.dumps(self.templates)
                hold = (self.key, tensors, templates)
                worker.holds = (self.key, len(self.templates))
            self._send(worker, (method, (packed[position], self.key), hold), clients[position])
            busy[worker.index] = position

        errors: Dict[int, Exception] = {}
        for worker in self.workers[:len(waiting)]:
            give(worker)
        while busy:
            ready = wait([self.workers[i].connection for i in busy] + [self.workers[i].process.sentinel for i in busy])
            for worker in [self.workers[i] for i in list(busy)]:
                if worker.connection not in ready and worker.process.sentinel not in ready:
                    continue
                position = busy.pop(worker.index)
                status, reply = self._receive(worker, clients[position])
                if status == "error":
                    # In turn, the first client in order to fail stops the round: finish the clients before
                    # it (one of them may fail first), start none after it.
                    errors[position] = reply
                    waiting = [i for i in waiting if i < min(errors)]
                else:
                    replies[position] = reply
                    progress.current().advance()
                if waiting:
                    give(worker)
        if errors:
            raise errors[min(errors)]
        return table, [replies[i] for i in range(len(clients))]

    def _send(self, worker: _Worker, message: tuple, client: Client) -> None:
        try:
            worker.connection.send(message)
        except (BrokenPipeError, EOFError, OSError):
            raise self._lost(worker, client) from None

    def _receive(self, worker: _Worker, client: Client) -> tuple:
        try:
            return worker.connection.recv()
        except (EOFError, OSError, ConnectionResetError):
            raise self._lost(worker, client) from None

    def _lost(self, worker: _Worker, client: Client) -> RunError:
        worker.process.join(timeout=1)
        code = worker.process.exitcode
        self.close()
        how = "was killed" if code is not None and code < 0 else f"ended (exit status {code})"
        return RunError(f"worker process {worker.index} (pid {worker.process.pid}) {how} with client {client.id}; "
                        f"the client may exhaust the memory (each worker keeps the data of the clients it "
                        f"met): fewer --workers, or --executor sequential")

    def close(self) -> None:
        for worker in self.workers:
            try:
                worker.connection.send(None)
            except (BrokenPipeError, EOFError, OSError):
                pass
        for worker in self.workers:
            worker.process.join(timeout=5)
            if worker.process.is_alive():
                worker.process.terminate()
                worker.process.join(timeout=5)
            worker.connection.close()
        self.workers = []
