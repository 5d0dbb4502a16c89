"""Slow clients and time-based selection (``-tsr``, ``-ssr``, ``-ts``, ``-tth``), on simulated time.

PFLlib marks clients slow, makes them sleep, measures wall-clock time and, at each round, leaves out of
aggregation the clients whose mean time exceeds ``-tth``. Here nobody sleeps and no clock is read: a
client's time in a round is computed from what it does (its minibatches and the model it receives) and,
for a slow client, a random factor. Everything is drawn from generators of their own, seeded from
``--seed``, the client id and the round, so runs are reproducible, resumable (nothing is kept but the
recorded series) and a run without these flags draws exactly what it drew before.

The model, in simulated seconds (documented in docs/command-line.md, "Simulated client time"):

* slow clients: ``int(rate * nc)`` distinct clients per kind (training, sending), drawn once per run;
* training, for a client trained in round r: ``epochs * ceil(n / batch) * (BATCH_TIME + SLOW_BATCH_TIME * u)``,
  the second term for slow-to-train clients only, ``u`` uniform in [0, 1) drawn per client and round;
* sending, every client every round (each receives the model): ``SEND_TIME + SLOW_SEND_TIME * v`` likewise;
* a client's time (what ``-tth`` bounds): its mean training time over the rounds it trained plus its mean
  sending time over the rounds so far, this round's included (PFLlib's rule);
* a round's time: the largest training plus sending time of this round among the clients aggregated.
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Sequence

import numpy as np

BATCH_TIME = 0.01        # simulated seconds per minibatch of every client
SLOW_BATCH_TIME = 0.1    # at most this much more per minibatch of a slow-to-train client (PFLlib sleeps 0.1 * U)
SEND_TIME = 0.01         # simulated seconds for a client to receive the model
SLOW_SEND_TIME = 1.0     # at most this much more for a slow-to-send client

_STREAM = 7302           # keeps these generators apart from every other seeded stream of the run
TRAIN, SEND = 0, 1       # the two kinds of slowness


def slow_clients(seed: int, num_clients: int, rate: float, kind: int) -> np.ndarray:
    """0/1 of each client: 1 for the ``int(rate * num_clients)`` clients slow at ``kind`` (distinct, drawn
    from ``seed``)."""
    mask = np.zeros(num_clients, dtype=np.int64)
    count = min(num_clients, int(rate * num_clients))
    if count:
        rng = np.random.default_rng([seed, _STREAM, kind])
        mask[rng.choice(num_clients, size=count, replace=False)] = 1
    return mask


def draw(seed: int, kind: int, client_id: int, rnd: int) -> float:
    """The uniform [0, 1) factor of client ``client_id`` in round ``rnd`` for ``kind``."""
    return float(np.random.default_rng([seed, _STREAM, kind, client_id, rnd]).random())


class SimulatedTime:
    """The run's slow clients and each client's simulated time (inactive without the four flags)."""

    def __init__(self, config, num_clients: int):
        self.seed = int(config.seed)
        self.epochs = int(config.local_epochs)
        self.batch_size = int(config.batch_size)
        self.select = bool(config.time_select)
        self.threshold = float(config.time_threthold)
        self.active = config.train_slow_rate > 0 or config.send_slow_rate > 0 or self.select
        self.train_slow = slow_clients(self.seed, num_clients, config.train_slow_rate, TRAIN)
        self.send_slow = slow_clients(self.seed, num_clients, config.send_slow_rate, SEND)

    def train_time(self, client_id: int, rnd: int, samples: int) -> float:
        per_batch = BATCH_TIME
        if self.train_slow[client_id]:
            per_batch += SLOW_BATCH_TIME * draw(self.seed, TRAIN, client_id, rnd)
        return self.epochs * math.ceil(samples / self.batch_size) * per_batch

    def send_time(self, client_id: int, rnd: int) -> float:
        extra = SLOW_SEND_TIME * draw(self.seed, SEND, client_id, rnd) if self.send_slow[client_id] else 0.0
        return SEND_TIME + extra

    def round_rows(self, rnd: int, trained: Dict[int, int]) -> tuple:
        """This round's (training, sending) time of every client: NaN training time for those not trained
        (``trained``: id -> training samples of those trained)."""
        n = len(self.train_slow)
        train = np.full(n, np.nan)
        for cid, samples in trained.items():
            train[cid] = self.train_time(cid, rnd, samples)
        send = np.array([self.send_time(cid, rnd) for cid in range(n)])
        return train, send

    @staticmethod
    def client_times(train_rows: Sequence[np.ndarray], send_rows: Sequence[np.ndarray]) -> np.ndarray:
        """Each client's time: mean training time over the rounds it trained (0 if none) plus mean
        sending time over the rounds recorded."""
        train = np.asarray(train_rows, dtype=float)
        trained = ~np.isnan(train)
        counts = trained.sum(axis=0)
        totals = np.where(trained, train, 0.0).sum(axis=0)
        mean_train = np.divide(totals, counts, out=np.zeros_like(totals), where=counts > 0)
        return mean_train + np.asarray(send_rows, dtype=float).mean(axis=0)

    def left_out(self, times: np.ndarray, candidates: Sequence[int]) -> Optional[set]:
        """The ids among ``candidates`` whose time exceeds ``-tth`` (with ``-ts``; None without)."""
        if not self.select:
            return None
        return {cid for cid in candidates if times[cid] > self.threshold}
