"""Speed-up of the Ray executor over sequential clients, MNIST / CNN, 20 clients, batch 10.

    python benchmarks/ray_speedup.py [--rounds 2] [--workers 2]

Each configuration runs in its own process (the thread count must be fixed before torch starts):

* sequential, 1 thread and 2 threads per process;
* Ray with ``--workers`` workers of 1 thread each (the driver uses 1 thread too, so the results are
  bit-identical to sequential with 1 thread - checked here).

Reported: seconds of local training per round (the ``train_clients`` hook), Ray's start-up apart, and
what the Ray executor sent its workers in the last round (the round's shared tensors once per worker,
each client's own state; :mod:`flcore.executors.shipping`).
Needs ``dataset/MNIST-dir0.1`` (``benchmarks/fedlag_accuracy.py`` builds it) and requirements-distributed.txt.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from app.build import build_server, prepare
from app.options import parse_args
from app.run import FederatedRun
config, _ = prepare(parse_args(sys.argv[2:]))
server = build_server(config)
spent, sent = [], []
original = server.train_clients
def timed(clients):
    start = time.perf_counter()
    original(clients)
    spent.append(time.perf_counter() - start)
    sent.append(dict(getattr(server.executor, "sent_bytes", {})))
server.train_clients = timed
FederatedRun(server).execute()
model = sum(t.numel() * t.element_size() for t in server.global_model.state_dict().values())
print("RESULT " + json.dumps({"train": spent, "acc": list(map(float, server.rs_test_acc)), "sent": sent,
                              "model": model}))
"""


def measure(threads: int, executor: str, workers: int, rounds: int, out: Path) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    flags = ["-data", "MNIST-dir0.1", "-m", "CNN", "-nc", "20", "-gr", str(rounds - 1), "-dev", "cpu",
             "-go", f"{executor}{threads}", "--results_dir", str(out), "--executor", executor,
             "--workers", str(workers)]
    proc = subprocess.run([sys.executable, "-c", CHILD, str(REPO / "system"), *flags], env=env,
                          capture_output=True, text=True, check=True)
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--rounds", type=int, default=2)
    cli.add_argument("--workers", type=int, default=2)
    cli.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "ray_speedup")
    opts = cli.parse_args()
    runs = {"sequential, 1 thread": measure(1, "sequential", 1, opts.rounds, opts.out),
            "sequential, 2 threads": measure(2, "sequential", 1, opts.rounds, opts.out),
            f"ray, {opts.workers} workers x 1 thread": measure(1, "ray", opts.workers, opts.rounds, opts.out)}
    base = runs["sequential, 1 thread"]
    print(f"\nMNIST/CNN, 20 clients, batch 10: local training per round (mean of {opts.rounds} rounds)")
    for name, result in runs.items():
        seconds = sum(result["train"]) / len(result["train"])
        ratio = (sum(base["train"]) / len(base["train"])) / seconds
        print(f"  {name:<28}{seconds:8.2f} s   speed-up vs sequential 1 thread: {ratio:.2f}x")
    ray_run = runs[f"ray, {opts.workers} workers x 1 thread"]
    print(f"ray accuracies identical to sequential (1 thread): {ray_run['acc'] == base['acc']}")
    sent = ray_run["sent"][-1]
    print(f"sent to the workers in the last round: {sent['shared'] / 1e6:.2f} MB of shared tensors (once per worker) "
          f"and {sent['clients'] / 1e6:.2f} MB of the clients' own state; a whole model is "
          f"{ray_run['model'] / 1e6:.2f} MB, which shipping each client with its model would send per client")


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"({time.perf_counter() - start:.0f} s in all)")
