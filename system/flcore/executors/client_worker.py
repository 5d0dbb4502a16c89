"""What trains and evaluates clients away from the server, one worker at a time: a Ray actor
(:mod:`.ray_cluster`) or a process of this machine's pool (:mod:`.process_pool`) holds one of these.

A worker reads each client's data from the dataset's files once and keeps it, holds the run's module
templates and the latest shared tensors (:mod:`.shipping`), and trains or evaluates whatever client it is
sent against them. It never keeps a client: the server owns every client's state between rounds.
"""
from __future__ import annotations

import os
import pickle
from typing import Dict, Optional, Tuple

import torch

from flcore.executors.shipping import SharedTable, train_shipped
from utils.client_data import load_client_splits
from utils.datasets import DatasetInfo
from utils.metrics import ClientEvaluation


class ClientWorker:
    """One worker's clients' data, templates and shared tensors; :meth:`train` and :meth:`evaluate` take a
    pickled client and return a pickle, both against the table of the key they name."""

    def __init__(self, info: DatasetInfo, device: str, num_classes: int, few_shot: int, channels_last: bool,
                 threads: int, val_ratio: float = 0.0, keep_gradients: bool = False):
        # As many intra-op threads as the server's process: float sums depend on the count.
        torch.set_num_threads(threads)
        self.info, self.device = info, torch.device(device)
        self.keep_gradients = keep_gradients
        self.splits = dict(num_classes=num_classes, few_shot=few_shot, channels_last=channels_last,
                           val_ratio=val_ratio)
        self.data: Dict[int, tuple] = {}
        self.templates: list = []
        self.table: Tuple[int, Optional[SharedTable]] = (-1, None)

    def _with_data(self, client):
        """``client`` (shipped without data) given its train, test and validation data, split as the
        server split them (--val_ratio included), read on first use and kept."""
        if client.id not in self.data:
            self.data[client.id] = load_client_splits(self.info, client.id, self.device, **self.splits)
        client.take_data(*self.data[client.id])
        return client

    def _table(self, key: int) -> SharedTable:
        held, table = self.table
        if held != key:
            raise RuntimeError(f"a client shipped against table {key} reached a worker holding table {held}")
        return table

    def hold(self, key: int, tensors: bytes, templates: Optional[bytes]) -> None:
        """Keep table ``key``'s shared tensors (and, when sent, the run's templates) for the clients that
        follow."""
        if templates is not None:
            self.templates = pickle.loads(templates)
        self.table = (key, SharedTable(pickle.loads(tensors), self.templates))

    def pid(self) -> int:
        return os.getpid()

    def train(self, packed: bytes, key: int) -> bytes:
        """Train the client pickled in ``packed`` against table ``key``; its state and update, pickled."""
        table = self._table(key)
        client = self._with_data(table.loads(packed))
        return table.dumps(train_shipped(client, self.keep_gradients))

    def evaluate(self, packed: bytes, key: int) -> bytes:
        """The client pickled in ``packed``, evaluated as :func:`~.sequential.evaluate_in_turn` does (its
        evaluation model on its test and train data); its :class:`ClientEvaluation`, pickled."""
        client = self._with_data(self._table(key).loads(packed))
        client.check_out()
        result = ClientEvaluation(client.test_metrics(), *client.train_metrics())
        return pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)


def worker_arguments(server) -> tuple:
    """:class:`ClientWorker`'s arguments for ``server``'s run: how its clients' data is read and split,
    its thread count, and whether updates keep their gradients."""
    x = server.clients[0].train_data.x
    channels_last = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    return (server.data_info, str(server.device), server.num_classes, server.few_shot, channels_last,
            torch.get_num_threads(), server.config.val_ratio, server.upload_needs_gradients())
