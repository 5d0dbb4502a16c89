"""One place that seeds every random number generator a run touches."""
from __future__ import annotations

import random

import numpy as np
import torch

# The largest seed a run may use. NumPy's legacy seeding (np.random.seed) takes 0 .. 2**32 - 1 and torch's
# takes less than 2**64; within this range Python, NumPy and torch all take the seed as it is, so no two
# seeds share a stream (the ``% 2**32`` below never folds one onto another) and none overflows.
MAX_SEED = 2**32 - 1


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def client_generator(seed: int, client_id: int) -> torch.Generator:
    """A client's own generator for batch order: independent of which clients train and in what order."""
    return torch.Generator().manual_seed(_mix(seed, 1 + client_id))


def sampler_rng(seed: int) -> np.random.Generator:
    """The server's generator for client sampling and client drop-out."""
    return np.random.default_rng(_mix(seed, 0))


# The stream of --eval_clients' sample, apart from the clients' (1 + id) and the sampler's (0).
_EVALUATION_STREAM = 2**31 - 1


def evaluation_sample(seed: int, clients: int, size: int) -> np.ndarray:
    """The sorted ids of the ``size`` of ``clients`` clients a run evaluates (``--eval_clients``), drawn
    once per run on a stream of their own."""
    rng = np.random.default_rng(_mix(seed, _EVALUATION_STREAM))
    return np.sort(rng.choice(clients, size=size, replace=False))


# Streams of the model initialisations an algorithm draws besides the run's model (IFCA's cluster models),
# far above the client streams (1 + client id) so that no client count reaches them.
_MODEL_STREAMS = 2**31


def model_seed(seed: int, index: int) -> int:
    """The seed of extra model ``index`` of a run seeded ``seed`` (IFCA's cluster model ``index``)."""
    return _mix(seed, _MODEL_STREAMS + index)


def _mix(seed: int, stream: int) -> int:
    # SeedSequence spreads (seed, stream) over 64 bits so nearby seeds give unrelated streams.
    return int(np.random.SeedSequence([seed % 2**32, stream]).generate_state(1, np.uint64)[0] >> 1)
