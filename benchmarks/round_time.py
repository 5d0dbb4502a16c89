"""Seconds per FedAvg round on MNIST/CNN, split into phases, against a PFLlib-style local loop.

    python benchmarks/round_time.py [--rounds 3] [--source ../shared/data/mnist-70k.npz]

Setting of the PFLlib reference (issue "Foundation"): MNIST, 20 clients, Dirichlet 0.1, ``-m CNN
-lbs 10 -ls 1 -jr 1``. The dataset is built from ``--source`` when ``dataset/MNIST`` is missing.

Besides the phase split of our rounds, the same run times a PFLlib-style local epoch - a
``DataLoader`` over a list of per-sample tensors, the model in PFLlib's layer order and memory
format - on a few clients, and extrapolates it to all training samples, so the comparison is a
ratio measured on the same machine at the same moment.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "system"), str(REPO)]  # an entry script: the project's packages

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from app.build import build_server, prepare  # noqa: E402
from app.options import parse_args  # noqa: E402
from app.run import FederatedRun  # noqa: E402

PHASES = ("select_clients", "send_models", "evaluate", "train_clients", "receive_models",
          "aggregate_parameters")


def ensure_mnist(source: Path, name: str) -> None:
    if (REPO / "dataset" / name / "config.json").is_file():
        return
    subprocess.run([sys.executable, str(REPO / "dataset" / "generate_MNIST.py"), "noniid", "-", "dir",
                    "--num-clients", "20", "--alpha", "0.1", "--source", str(source), "--name", name],
                   check=True)


def time_phases(server, totals):
    """Wrap the server's hooks so each call adds its wall time to ``totals[hook]``."""
    for name in PHASES:
        original = getattr(server, name)

        def timed(*a, _original=original, _name=name, **kw):
            start = time.perf_counter()
            out = _original(*a, **kw)
            totals[_name] += time.perf_counter() - start
            return out
        setattr(server, name, timed)


class PFLlibStyleCNN(nn.Module):
    """FedAvgCNN as PFLlib lays it out: ReLU before pooling, default (NCHW) memory format."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(1, 32, 5), nn.ReLU(), nn.MaxPool2d(2))
        self.conv2 = nn.Sequential(nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2))
        self.fc1 = nn.Sequential(nn.Linear(1024, 512), nn.ReLU())
        self.fc = nn.Linear(512, 10)

    def forward(self, x):
        return self.fc(self.fc1(torch.flatten(self.conv2(self.conv1(x)), 1)))


def pfllib_style_seconds_per_sample(server, num_clients: int = 2) -> float:
    """One local epoch the PFLlib way (list of samples, DataLoader, batch 10) on a few clients."""
    model = PFLlibStyleCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.005)
    loss_fn = nn.CrossEntropyLoss()
    samples, elapsed = 0, 0.0
    for client in server.clients[:num_clients]:
        start = time.perf_counter()
        split = client.train_data  # PFLlib holds float images: decode our stored pixel codes first
        data = [(x.contiguous(), y) for x, y in zip(split.inputs(split.x), split.y)]
        loader = DataLoader(data, batch_size=10, shuffle=True, drop_last=True)
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        elapsed += time.perf_counter() - start
        samples += len(data)
    return elapsed / samples


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--rounds", type=int, default=3)
    cli.add_argument("--source", type=Path, default=REPO.parent / "shared" / "data" / "mnist-70k.npz")
    cli.add_argument("--name", default="MNIST", help="dataset folder to use or build")
    opts = cli.parse_args()
    ensure_mnist(opts.source, opts.name)

    config, _ = prepare(parse_args(["-data", opts.name, "-m", "CNN", "-lbs", "10", "-ls", "1", "-jr", "1",
                                    "-nc", "20", "-gr", str(opts.rounds - 1), "-dev", "cpu", "-go", "bench"]))
    start = time.perf_counter()
    server = build_server(config)
    setup = time.perf_counter() - start
    totals = defaultdict(float)
    time_phases(server, totals)
    start = time.perf_counter()
    FederatedRun(server).execute()
    total = time.perf_counter() - start
    per_round = total / opts.rounds
    train_samples = sum(c.train_samples for c in server.clients)

    print(f"\nMNIST / CNN, 20 clients, batch 10, {opts.rounds} rounds, {torch.get_num_threads()} threads")
    print(f"setup (read all client data once, build clients): {setup:.2f} s")
    print(f"{'phase':<22}{'s/round':>10}{'share':>9}")
    for name in PHASES:
        print(f"{name:<22}{totals[name] / opts.rounds:>10.3f}{totals[name] / total:>9.1%}")
    other = total - sum(totals.values())
    print(f"{'(loop, results)':<22}{other / opts.rounds:>10.3f}{other / total:>9.1%}")
    print(f"{'round':<22}{per_round:>10.3f}")
    print(f"final accuracy {server.rs_test_acc[-1]:.4f}")

    reference = pfllib_style_seconds_per_sample(server) * train_samples
    ours = totals["train_clients"] / opts.rounds
    print(f"\nlocal training of all {train_samples} samples, same machine, same moment:")
    print(f"  PFLlib-style loop (DataLoader over samples, NCHW): {reference:.2f} s")
    print(f"  ours (index batches, pool-before-ReLU, channels-last): {ours:.2f} s  "
          f"({ours / reference:.2f}x)")


if __name__ == "__main__":
    main()
