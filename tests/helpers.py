"""What the tests share: the flags of a small run, servers and their runs built as main.py builds them,
synthetic images, state comparisons, and the checks several algorithms' tests make.

Imported as ``from helpers import ...`` (pytest puts this folder on the path for its conftest.py); the
fixtures themselves are in conftest.py."""
from __future__ import annotations

import math
import weakref
from pathlib import Path
from typing import Iterable

import numpy as np
import torch

# Tests run many small models: one thread avoids oversubscribing a shared 2-core machine. It is also the
# count every test that compares results across processes gives its subprocesses (``main_command``):
# float sums depend on the intra-op thread count, so both sides must use the same one, whatever the
# environment (OMP_NUM_THREADS) says.
TEST_THREADS = 1
torch.set_num_threads(TEST_THREADS)

from app.build import build_server, hyperparameters, prepare
from app.options import parse_args
from app.run import FederatedRun, run_results_file
from flcore.aggregation import named_tensors
from utils.result_utils import read_results

REPO = Path(__file__).resolve().parents[1]


def main_command(*flags: str, script: Path | None = None) -> list[str]:
    """``python system/main.py *flags`` with the tests' explicit thread count."""
    import sys
    return [sys.executable, str(script or REPO / "system" / "main.py"), *flags, "--threads", str(TEST_THREADS)]


def pinned_thread_env(**extra: str) -> dict:
    """The environment for a subprocess that cannot take ``--threads`` (e.g. upstream PFLlib's main.py)
    and whose results are compared: the thread variables pinned to the tests' count."""
    import os
    env = dict(os.environ, OMP_NUM_THREADS=str(TEST_THREADS), MKL_NUM_THREADS=str(TEST_THREADS))
    env.update(extra)
    return env


def full_disk_from(call: int, real=None):
    """A stand-in for a writer: calls ``real`` until its ``call``-th use, which, and every later one, fails
    as a full disk does (``OSError`` ENOSPC, naming the first argument when it is a path)."""
    import errno
    import os
    calls = []

    def write(*args, **kwargs):
        calls.append(args)
        if len(calls) >= call:
            where = str(args[0]) if args and isinstance(args[0], (str, Path)) else None
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), where)
        return real(*args, **kwargs)
    return write


def make_images(n: int, shape=(1, 8, 8), num_classes: int = 4, seed: int = 0):
    """Separable synthetic images: each class lights a different block of pixels, plus noise."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % num_classes
    x = rng.normal(0, 0.3, size=(n, *shape)).astype(np.float32)
    flat = x.reshape(n, -1)
    block = flat.shape[1] // num_classes
    for k in range(num_classes):
        flat[y == k, k * block:(k + 1) * block] += 1.0
    return x, y.astype(np.int64)


def cli(data_dir: Path, results_dir: Path, *extra: str) -> list[str]:
    """Flags for a run on the test data. ``X+LAG`` tests compose on single tensors (the small DNN has only
    two modules, so the default module granularity would leave K = 2 nothing to share); tests of the
    default granularity pass ``--lag_granularity module`` (the last value given wins)."""
    return ["-data", "Toy", "-nc", "6", "-gr", "2", "-dev", "cpu", "-m", "DNN", "-lr", "0.05",
            "--data_dir", str(data_dir), "--results_dir", str(results_dir), "--lag_granularity", "tensor", *extra]


def server_for(data_dir: Path, results_dir: Path, *extra: str, run: int = 0):
    """The server ``main.py`` would build for these flags; resumed (by its :func:`run_of`) with ``--resume``."""
    config, _ = prepare(parse_args(cli(data_dir, results_dir, *extra)))
    server = build_server(config, run)
    if config.resume:
        note = run_of(server).resume()
        if note:
            print(f"note: {note}")
    return server


_RUNS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def run_of(server) -> FederatedRun:
    """The one :class:`FederatedRun` driving ``server`` in a test (what it resumed is kept for its rounds)."""
    if server not in _RUNS:
        _RUNS[server] = FederatedRun(server)
    return _RUNS[server]


def train(server) -> FederatedRun:
    """Run the remaining rounds of ``server`` as ``main.py`` does (lock, loop, results); returns its run."""
    federated_run = run_of(server)
    federated_run.execute()
    return federated_run


def results_file(server) -> Path:
    """Where ``server``'s run writes its .h5."""
    return run_results_file(server.config, server.times)


def state_equal(a: dict, b: dict, names: Iterable[str] | None = None) -> bool:
    """Bit-identical tensors under ``names`` (NaN equals NaN; entries that are None in both match)."""
    names = a.keys() if names is None else names
    return all(_same(a[n], b[n]) for n in names)


def _same(x, y) -> bool:
    if x is None or y is None:
        return x is None and y is None
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    if x.is_floating_point():
        return bool(((x == y) | (x.isnan() & y.isnan())).all())
    return torch.equal(x, y)


def server_of_class(server_class, data_dir: Path, results_dir: Path, *extra: str, head_split: bool = True):
    """A server of an arbitrary class (e.g. one defined in a test) on the 'Toy' data."""
    from flcore.trainmodel.models import build_model, split_head
    from utils.datasets import dataset_info
    from utils.seeding import seed_everything
    config, _ = prepare(parse_args(cli(data_dir, results_dir, *extra)))
    seed_everything(config.seed)
    info = dataset_info(config.dataset, config.num_clients, config.data_dir)
    model = build_model(config.model, info.input_shape, config.num_classes)
    return server_class(config, hyperparameters(config), 0, split_head(model) if head_split else model, info)


# Flags some methods need on these tiny runs (PFLlib's shared defaults they replace refuse or switch the method
# off; pFedMe's own lambda 15 and personal lr 0.09 diverge at these runs' -lr 0.05). pFedMe's -K and FedALA's -s
# only keep the runs cheap.
METHOD_FLAGS = {"pFedMe": ("-bt", "1", "-K", "2", "-lam", "1", "-lrp", "0.01"), "PerAvg": ("-bt", "0.05"),
                "FedCAC": ("-bt", "1"), "FedPHP": ("-lam", "0.1"), "FedAMP": ("-alk", "0.1", "-lam", "0.1"),
                "FedBABU": ("-fte", "1"), "FedALA": ("-s", "20")}


def in_use(client):
    """``client``, checked out as an executor checks it out before a hook (its modules and own tensors
    attributes again: ``client.model`` a working module); the run parks it after the hook, a test when it
    trains or broadcasts through the run's loop, or by ``client.park()``."""
    client.check_out()
    return client


def method_flags(name: str) -> tuple:
    return METHOD_FLAGS.get(name.removesuffix("+LAG"), ())


def training_loss_of(client, state) -> float:
    """Mean cross-entropy on ``client``'s training data of its model loaded with ``state`` (eval mode),
    written out with torch alone (what a clustered method's choice of model compares)."""
    import copy
    probe = copy.deepcopy(in_use(client).model)
    probe.load_state_dict(state)
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(probe.eval()(client.train_data.x), client.train_data.y))


def upload_current_state(server, clients=None) -> None:
    """Keep, as ``train_clients`` would, the update each client would send in its current state (for
    tests that set a client's state by hand before ``receive_models``)."""
    clients = server.selected_clients if clients is None else clients
    server.trained_updates = {c.id: c.release(in_use(c).upload()) for c in clients}


def uploads_are(server, part) -> bool:
    """Whether every upload holds exactly ``part(client)``'s tensors (names and bits), and holds the very
    tensors the uploader keeps: no copy per upload."""
    by_id = {c.id: c for c in server.clients}
    for update in server.uploads:
        client = by_id[update.client_id]
        kept = client.module_tensors()  # before part() checks the model out
        own = named_tensors(part(in_use(client)))
        if set(update.tensors) != set(own):
            return False
        if any(not torch.equal(t, own[n]) or t.data_ptr() != kept[update.full_name(n)].data_ptr()
               for n, t in update.tensors.items()):
            return False
    return bool(server.uploads)


def play_round(server):
    """One round of the loop without evaluation: select, send, train, receive, aggregate."""
    server.selected_clients = server.select_clients()
    server.send_models()
    server.train_clients(server.selected_clients)
    server.receive_models()
    server.aggregate_parameters()


def original_and_restored_twin(data_dir: Path, tmp_path: Path, *flags: str, rounds_before: int = 1):
    """A server after ``rounds_before`` rounds, and a twin built with another seed that loads its state
    through ``torch.save``/``torch.load(weights_only=True)`` as a checkpoint does; then one more round
    each. A faithful state export leaves the two bit-identical."""
    import torch
    original = server_for(data_dir, tmp_path, *flags)
    for _ in range(rounds_before):
        play_round(original)
    torch.save(original.get_state(), tmp_path / "state.pt")
    twin = server_for(data_dir, tmp_path, *flags, "--seed", "7")
    twin.set_state(torch.load(tmp_path / "state.pt", weights_only=True))
    play_round(original)
    play_round(twin)
    return original, twin


def perturb_all_clients(server) -> None:
    """Give every client (participant or not) floating-point tensors of its own."""
    import torch
    from flcore.aggregation import named_tensors
    with torch.no_grad():
        for client in server.clients:
            for tensor in named_tensors(in_use(client).model).values():
                if tensor.is_floating_point():
                    tensor.add_(0.01 * (client.id + 1))


def assert_lag_composes(server, k: int = 2, private=None, sent_back=frozenset()) -> set:
    """Check an ``X+LAG`` server: after a round, at most ``k`` of X's shared layers are personal (``k``:
    the extra layers, i.e. ``--lag_top_k`` minus the layers X keeps personal itself), and a broadcast
    leaves every client's LAG-personal tensors, X's own non-shared tensors and ``private(client)``
    (a dict of any other per-client tensors, e.g. Ditto's personal model) bit-identical. ``sent_back``:
    non-shared tensors the server keeps a copy of and sends each client its own of (FedGC's head).

    Plays up to four rounds, until a round has a conflicting pair. Returns the set of LAG-personal names (the
    tensors of at most k layers; layers without any conflict are never chosen).
    """
    import copy
    from flcore.aggregation import named_tensors
    assert server.lag_selector.extra == k, (server.lag_selector.own_personal, server.lag.top_k)
    # A free place fills in the first round with a conflicting pair, which a round may lack.
    for _ in range(4):
        play_round(server)
        if server.lag_personal:
            break
    candidates = {n for layer in server.lag_layers for n in layer.tensors}
    personal = set(server.lag_personal_names())
    assert 1 <= len(server.lag_personal) <= k, server.lag_personal
    assert personal == {n for i in server.lag_personal for n in server.lag_layers[i].tensors}
    assert personal <= candidates
    shared_rel = named_tensors(in_use(server.clients[0]).shared_module())
    prefix = server.clients[0].shared_path + "." if server.clients[0].shared_path else ""
    uploaded = {prefix + n for n in shared_rel if server.clients[0].shares(n)}
    assert candidates <= uploaded, "LAG ranked a tensor the base method does not share"
    perturb_all_clients(server)
    private = private or (lambda client: {})
    before = {c.id: copy.deepcopy(named_tensors(c.model)) for c in server.clients}
    before_private = {c.id: copy.deepcopy(private(c)) for c in server.clients}
    server.selected_clients = server.select_clients()
    server.send_models()
    for client in server.clients:
        state = named_tensors(client.model)
        own = set(state) - uploaded - set(sent_back)  # what X itself never shares
        assert state_equal(state, before[client.id], personal | own), f"client {client.id}"
        assert state_equal(private(client), before_private[client.id]), f"client {client.id} private state"
    return personal


ACCURACY_ARRAYS = ("rs_test_acc", "rs_test_auc", "rs_train_loss", "rs_client_acc")


def train_and_compare(first, second):
    """Train two servers and assert that their accuracy arrays are bit-identical; returns both runs'
    ``(arrays, attrs)`` for further checks."""
    train(first)
    train(second)
    a, b = read_results(results_file(first)), read_results(results_file(second))
    for name in ACCURACY_ARRAYS:
        assert np.array_equal(a[0][name], b[0][name]), name
    return a, b


def serve_a_broken_download(monkeypatch, body: bytes, refuse: bool) -> None:
    """Every download (``dataset.utils.release``) writes ``body``, a page that is not the release, and,
    with ``refuse``, then fails as a refused connection does."""
    from urllib.error import URLError
    from dataset.utils import release

    def retrieve(url, filename):
        Path(filename).write_bytes(body)
        if refuse:
            raise URLError("[Errno 111] Connection refused")
    monkeypatch.setattr(release.urllib.request, "urlretrieve", retrieve)


# ----- the vmapped engine against the sequential loop ---------------------------------------------
# Float state after batched training may differ from sequential by how vmap batches matrix products.
ATOL = RTOL = 1e-5


def assert_close(a, b, where: str = "") -> None:
    """Recursive comparison of exported states: float tensors and numbers within the tolerance,
    everything else (integer tensors, generator states, strings) exactly."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for key in a:
            assert_close(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype, where
        if a.is_floating_point():
            assert torch.allclose(a, b, atol=ATOL, rtol=RTOL, equal_nan=True), \
                f"{where}: max difference {float((a - b).abs().max())}"
        else:
            assert torch.equal(a, b), where
    elif isinstance(a, float):
        assert math.isclose(a, b, rel_tol=RTOL, abs_tol=ATOL) or (math.isnan(a) and math.isnan(b)), where
    else:
        assert a == b, where


def train_both(data_dir, tmp_path, *flags, rounds: int = 2):
    """Both executors on the same flags; returns ``{executor: (server, arrays)}``."""
    runs = {}
    for executor in ("sequential", "batched"):
        server = server_for(data_dir, tmp_path / executor, "-jr", "0.5", "-gr", str(rounds), *flags,
                            "--executor", executor)
        train(server)
        runs[executor] = (server, read_results(results_file(server))[0])
    return runs


def assert_same_training(runs) -> None:
    (first, arrays_a), (second, arrays_b) = runs["sequential"], runs["batched"]
    for a, b in zip(first.clients, second.clients):
        assert torch.equal(a.generator.get_state(), b.generator.get_state()), f"client {a.id}: other batches"
        assert_close(a.get_state(), b.get_state(), f"client {a.id}")
        # .grad is filled only for FedLAG's last_batch signal, its one reader (see the CNN test).
        for (name, p), q in zip(in_use(a).model.named_parameters(), in_use(b).model.parameters()):
            if q.grad is not None:
                assert_close(p.grad, q.grad, f"client {a.id} {name}.grad")
    # Every .h5 series but the timings: accuracies within one test sample, other floats within 1e-4,
    # the rest (FedLAG's personal layers per round, counts) identical.
    one_sample = 1.0 / sum(c.test_samples for c in first.clients)
    one_client_sample = 1.0 / min(c.test_samples for c in first.clients)
    assert set(arrays_a) == set(arrays_b)
    for name in set(arrays_a) - {"rs_round_time"}:
        x, y = np.asarray(arrays_a[name]), np.asarray(arrays_b[name])
        assert x.shape == y.shape, name
        if np.issubdtype(x.dtype, np.floating):
            tolerance = {"rs_test_acc": one_sample, "rs_client_acc": one_client_sample}.get(name, 1e-4)
            assert np.allclose(x, y, atol=tolerance, rtol=1e-4, equal_nan=True), name
        else:
            assert np.array_equal(x, y), name
    assert getattr(first, "lag_personal", None) == getattr(second, "lag_personal", None)
