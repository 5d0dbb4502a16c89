"""One local SGD step of many clients: one after another (as ``--executor sequential`` runs them) against
one vmapped step for all (the core of ``--executor batched``), per model, in milliseconds.

    python benchmarks/engine_step.py                      # CPU, one thread, 20 clients
    python benchmarks/engine_step.py --clients 20 100 --device cuda

A minute instead of the hours a whole CIFAR-10 / ResNet9 round takes on one CPU thread, so it gives the
ResNet9 figure ``engine_speed.py`` cannot on a CPU, and it shows where the time goes: the sequential side
runs convolutional models in the channels-last layout (as the clients do), which a vmapped step cannot
keep. Both sides do the same work: batch 10 per client, cross-entropy, forward, backward, SGD update.
The table goes to ``results/benchmarks/engine-speed/step.md`` (``--out``).
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "system"))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.func import functional_call, grad, vmap  # noqa: E402

from flcore.trainmodel.models import CONVOLUTIONAL, build_model  # noqa: E402

# (label, -m name, one sample's shape)
SETTINGS = (("MNIST / DNN", "DNN", (1, 28, 28)), ("MNIST / CNN", "CNN", (1, 28, 28)),
            ("CIFAR-10 / CNN", "CNN", (3, 32, 32)), ("CIFAR-10 / ResNet9", "ResNet9", (3, 32, 32)))
BATCH, LR = 10, 0.005


def per_step_ms(step: Callable[[], None], repeats: int, device: torch.device) -> float:
    step()  # warm-up (allocations, kernel choice)
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e3


def sequential_step(name: str, model: nn.Module, shape, clients: int, device) -> Callable[[], None]:
    models = [build_like(model, device) for _ in range(clients)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=LR) for m in models]
    xs = [torch.randn(BATCH, *shape, device=device) for _ in range(clients)]
    if name in CONVOLUTIONAL:  # channels-last inputs, as the clients' data of a channels-last model
        xs = [x.contiguous(memory_format=torch.channels_last) for x in xs]
    ys = [torch.randint(0, 10, (BATCH,), device=device) for _ in range(clients)]

    def step() -> None:
        for m, opt, x, y in zip(models, optimizers, xs, ys):
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
    return step


def vmapped_step(model: nn.Module, shape, clients: int, device) -> Callable[[], None]:
    template = build_like(model, device)
    params = {n: p.detach().unsqueeze(0).repeat(clients, *[1] * p.dim()) for n, p in template.named_parameters()}
    buffers = {n: b.unsqueeze(0).repeat(clients, *[1] * b.dim()) for n, b in template.named_buffers()}
    x = torch.randn(clients, BATCH, *shape, device=device)
    y = torch.randint(0, 10, (clients, BATCH), device=device)

    def loss(p: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor], xs, ys) -> torch.Tensor:
        return nn.functional.cross_entropy(functional_call(template, (p, b), (xs,)), ys)
    gradients = vmap(grad(loss))

    def step() -> None:
        grads = gradients(params, buffers, x, y)
        with torch.no_grad():
            for name, value in params.items():
                value.sub_(grads[name], alpha=LR)
    return step


def build_like(model: nn.Module, device) -> nn.Module:
    return copy.deepcopy(model).to(device).train()


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--device", default="cpu")
    cli.add_argument("--threads", type=int, default=1)
    cli.add_argument("--clients", type=int, nargs="+", default=[20])
    cli.add_argument("--repeats", type=int, default=3)
    cli.add_argument("--out", type=Path, default=REPO / "results" / "benchmarks" / "engine-speed" / "step.md")
    opts = cli.parse_args()
    torch.set_num_threads(opts.threads)
    torch.manual_seed(0)
    device = torch.device(opts.device)
    rows: List[Tuple[str, int, float, float]] = []
    for label, name, shape in SETTINGS:
        model = build_model(name, shape, 10)
        for clients in opts.clients:
            sequential = per_step_ms(sequential_step(name, model, shape, clients, device), opts.repeats, device)
            batched = per_step_ms(vmapped_step(model, shape, clients, device), opts.repeats, device)
            rows.append((label, clients, sequential, batched))
            print(f"{label:20s} {clients:4d} clients: sequential {sequential:9.1f} ms, vmapped {batched:9.1f} ms, "
                  f"speed-up {sequential / batched:.2f}x", flush=True)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    lines = ["# One local step of every client: sequential vs vmapped (ms per step of all clients)", "",
             f"Device: {where}; torch {torch.__version__}; {torch.get_num_threads()} intra-op thread(s); batch "
             f"{BATCH} per client; mean of {opts.repeats} steps after one warm-up step.", "",
             "| model | clients | sequential ms | vmapped ms | speed-up |", "|---|---|---|---|---|"]
    lines += [f"| {label} | {clients} | {s:.1f} | {b:.1f} | {s / b:.2f}x |" for label, clients, s, b in rows]
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text("\n".join(lines) + "\n")
    print(f"table in {opts.out}")


if __name__ == "__main__":
    main()
