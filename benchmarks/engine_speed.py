"""Seconds per round: the selected clients trained one after another, batched (one vmapped step for all
clients), and optionally on Ray workers.

    python benchmarks/engine_speed.py --quick                 # Digits, DNN and CNN, 20 clients: a CPU check
    python benchmarks/engine_speed.py --device cuda           # MNIST/CNN 20 clients, CIFAR-10/ResNet9 20 and 100
    python benchmarks/engine_speed.py --device cuda --batch_clients 0 25 --rounds 4 --ray
    python benchmarks/engine_speed.py --quick --batch_clients 20 5  # CPU: time the engine itself

On a CPU, ``--batch_clients 0`` trains a convolutional model one client at a time (the executor's
automatic choice there, see ``flcore/executors/vmapped.py``), so it times the sequential path; give a
number to time the batched engine on a CPU. ``benchmarks/engine_step.py`` times one step per model.

Settings (FedAvg, Dirichlet 0.1, PFLlib's local training: batch 10, lr 0.005, one epoch, every client
every round): MNIST (70,000 images) with ``-m CNN`` and 20 clients; the CIFAR-10 subset (20,000 images)
with ``-m ResNet9`` and 20 and 100 clients (at least 20 images each). The datasets are built offline
from ``../shared/data/*.npz`` with the project's generators when missing (``--data_dir``); ``--images N``
builds them from a seeded sample of N images instead (a round of the same steps, N / all as long). Each
executor runs ``--rounds`` rounds; round 0 (evaluation, warm-up) is left out and the median of the
others is reported, with the time spent in ``train_clients`` alone; after the rounds, one evaluation
of every client (batched as well under ``--executor batched``, its data already on the device) is
timed. ``--rounds 1`` (for a round that takes many minutes, as CIFAR-10 / ResNet9 on a CPU) times round
0 itself: its s/round then includes the evaluation, so the speed-up is taken from the training time.
Evaluation runs in round 0 only (``-eg`` past the last round), so the rounds timed are training, upload
and aggregation. The final accuracy (the last global model on every client's test set) is a sanity
check: the executors train the same clients on the same batches.

Writes ``table.md`` under ``--out`` (default ``results/benchmarks/engine-speed``); the runs' ``.h5``
files go to a temporary folder.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import List, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "system"), str(REPO)]  # an entry script: the project's packages

import numpy as np  # noqa: E402
import torch  # noqa: E402

from app.build import build_server, prepare  # noqa: E402
from app.options import parse_args  # noqa: E402
from app.run import FederatedRun, make_executor  # noqa: E402

SHARED = REPO.parent / "shared" / "data"
SOURCES = {"MNIST": ("generate_MNIST.py", SHARED / "mnist-70k.npz"),
           "Cifar10": ("generate_Cifar10.py", SHARED / "cifar10-20k.npz")}


@dataclass(frozen=True)
class Setting:
    label: str
    base: str          # generator (SOURCES key), or "" for the embedded Digits
    folder: str        # dataset folder under --data_dir
    model: str
    clients: int
    min_samples: int = 0  # the generator's --min-samples (0: its default, PFLlib's)
    images: int = 0       # a seeded sample of the source's images (0: all of them)


FULL = (Setting("MNIST / CNN, 20 clients", "MNIST", "MNIST-dir0.1", "CNN", 20),
        Setting("CIFAR-10 / ResNet9, 20 clients", "Cifar10", "Cifar10-dir0.1", "ResNet9", 20),
        # 200 images per client on average: no Dirichlet(0.1) draw gives all 100 clients PFLlib's 40.
        Setting("CIFAR-10 / ResNet9, 100 clients", "Cifar10", "Cifar10-dir0.1-nc100", "ResNet9", 100, 20))
QUICK = (Setting("Digits / DNN, 20 clients", "", "Digits", "DNN", 20),
         Setting("Digits / CNN, 20 clients", "", "Digits", "CNN", 20))


def sampled(setting: Setting, images: int) -> Setting:
    """The setting on a seeded sample of ``images`` of its source's images: a shorter round of the same
    steps, for a model whose round takes many minutes on a CPU. The smallest client allowed shrinks a little
    faster than the sample (4/5 of in proportion: 4 of 5,000 images, 8 of 10,000 for 100 clients), since
    with fewer images per client a Dirichlet(0.1) draw rarely gives every client the proportional share."""
    if not setting.base or not images:
        return setting
    source = np.load(SOURCES[setting.base][1])
    scale = images / len(source["y"])
    return replace(setting, label=setting.label.replace(" / ", f" ({images:,} images) / ", 1),
                   folder=f"{setting.folder}-n{images}", min_samples=max(1, int(setting.min_samples * scale * 0.8))
                   if setting.min_samples else 0, images=images)


def source_file(setting: Setting, data_dir: Path) -> Path:
    """The shared .npz, or a seeded sample of it written once under ``data_dir``."""
    full = SOURCES[setting.base][1]
    if not setting.images:
        return full
    path = data_dir / f"{full.stem}-n{setting.images}.npz"
    if not path.is_file():
        source = np.load(full)
        chosen = np.sort(np.random.default_rng(0).choice(len(source["y"]), setting.images, replace=False))
        np.savez(path, x=source["x"][chosen], y=source["y"][chosen])
    return path


def ensure_dataset(setting: Setting, data_dir: Path) -> None:
    """Build the setting's folder from the shared .npz when it is missing (Digits builds itself)."""
    if not setting.base or (data_dir / setting.folder / "config.json").is_file():
        return
    data_dir.mkdir(parents=True, exist_ok=True)
    script, source = SOURCES[setting.base][0], source_file(setting, data_dir)
    command = [sys.executable, str(REPO / "dataset" / script), "noniid", "-", "dir", "--alpha", "0.1",
               "--num-clients", str(setting.clients), "--source", str(source), "--name", setting.folder,
               "--root", str(data_dir)]
    if setting.min_samples:
        command += ["--min-samples", str(setting.min_samples)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def timed(server, method: str, totals: List[float], device: str) -> None:
    """Wrap ``server.<method>`` so each call appends its wall time (device work included)."""
    original = getattr(server, method)
    synchronise = torch.cuda.synchronize if device.startswith("cuda") and torch.cuda.is_available() else None

    def call(*args, **kwargs):
        if synchronise:
            synchronise()
        start = time.perf_counter()
        result = original(*args, **kwargs)
        if synchronise:
            synchronise()
        totals.append(time.perf_counter() - start)
        return result
    setattr(server, method, call)


def run_one(setting: Setting, executor: str, opts, results: Path,
            batch_clients: int = 0) -> Tuple[float, float, float, float, str]:
    """(median s/round and train s/round over rounds 1..rounds-1, s of one evaluation of every client with
    the run's executor, final accuracy, device)."""
    flags = ["-data", setting.folder, "-m", setting.model, "-nc", str(setting.clients), "-algo", "FedAvg",
             "-jr", "1", "-lbs", "10", "-ls", "1", "-lr", "0.005", "-gr", str(opts.rounds - 1),
             "-eg", str(opts.rounds + 1), "-dev", opts.device, "--data_dir", str(opts.data_dir),
             "--results_dir", str(results), "-go", f"{executor}{batch_clients}", "--executor", executor,
             "--batch_clients", str(batch_clients), "--workers", str(opts.workers)]
    if opts.threads:
        flags += ["--threads", str(opts.threads)]
    args, _ = prepare(parse_args(flags))
    server = build_server(args)
    training: List[float] = []
    timed(server, "train_clients", training, args.device)
    FederatedRun(server).execute()
    rounds = server.history["rs_round_time"][1:] or server.history["rs_round_time"]
    server.send_models()  # the final global model, as the next round would evaluate it
    if executor == "batched":  # evaluate as the run did (Ray's evaluation is the driver's, client by client)
        server.executor = make_executor(server, args)
        server.evaluate(prefix="rs_bench")  # untimed: the first call gathers each split on the device
    evaluations: List[float] = []
    timed(server, "evaluate", evaluations, args.device)
    accuracy = server.evaluate(prefix="rs_bench").accuracy
    server.executor.close()
    device = args.device
    del server
    gc.collect()
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.empty_cache()  # the next executor starts from an empty device
    return (statistics.median(rounds), statistics.median(training[1:] or training), evaluations[0], accuracy,
            device)


def device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({os.cpu_count()} cores visible)"


def main(argv: Sequence[str] | None = None) -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--quick", action="store_true", help="Digits / DNN and CNN, 20 clients (a CPU check)")
    cli.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    cli.add_argument("--rounds", type=int, default=3,
                     help="rounds per run; the first is not timed unless it is the only one")
    cli.add_argument("--threads", type=int, default=1,
                     help="torch intra-op threads (0 = torch's default); 1 on a shared CPU")
    cli.add_argument("--batch_clients", type=int, nargs="+", default=[0],
                     help="--batch_clients values to time (0 = the automatic choice: all clients of a round in "
                          "one group, but one at a time for a convolutional model on a CPU)")
    cli.add_argument("--ray", action="store_true", help="also time --executor ray (needs Ray)")
    cli.add_argument("--workers", type=int, default=4, help="Ray workers with --ray")
    cli.add_argument("--only", nargs="+", type=int, help="indices of the settings to run (default: all)")
    cli.add_argument("--images", type=int, default=0,
                     help="train on a seeded sample of this many of the source's images (0: all): shorter rounds "
                          "of the same steps, for CIFAR-10 / ResNet9 on a CPU")
    cli.add_argument("--data_dir", type=Path, default=REPO / "dataset")
    cli.add_argument("--out", type=Path, default=REPO / "results" / "benchmarks" / "engine-speed")
    opts = cli.parse_args(argv)
    if opts.rounds < 1:
        cli.error("--rounds must be at least 1")
    settings = QUICK if opts.quick else FULL
    if opts.only:
        settings = tuple(settings[i] for i in opts.only)
    settings = tuple(sampled(setting, opts.images) for setting in settings)
    if opts.threads:
        torch.set_num_threads(opts.threads)

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for setting in settings:
            ensure_dataset(setting, opts.data_dir)
            runs = [("sequential", 0)] + [("batched", b) for b in opts.batch_clients]
            if opts.ray:
                runs.append(("ray", 0))
            base = None
            for executor, batch in runs:
                per_round, training, evaluation, accuracy, device = run_one(setting, executor, opts, Path(folder),
                                                                            batch)
                basis = training if opts.rounds == 1 else per_round  # round 0 alone: leave its evaluation out
                base = base or basis
                group = ("auto" if batch == 0 else str(batch)) if executor == "batched" else \
                    (f"{opts.workers} workers" if executor == "ray" else "1")
                rows.append((setting.label, executor, group, per_round, training, base / basis, evaluation,
                             accuracy))
                print(f"{setting.label} | {executor} ({group}) | {per_round:.3f} s/round | train {training:.3f} s "
                      f"| x{base / basis:.2f} | evaluation {evaluation:.3f} s | acc {accuracy:.4f}", flush=True)

    threads = torch.get_num_threads()
    lines = [f"# Engine speed: seconds per round ({'quick, ' if opts.quick else ''}FedAvg, batch 10, one epoch, "
             f"every client every round)", "",
             f"Device: {device_name(device)}; torch {torch.__version__}; {threads} intra-op thread(s); "
             + (f"{opts.rounds} rounds per run, round 0 not timed (median of the others)." if opts.rounds > 1 else
              "1 round per run: round 0 timed, its evaluation included in s/round; speed-up from train s/round."),
             "",
             "| setting | executor | clients per step | s/round | train s/round | speed-up | evaluation s | "
             "final accuracy |",
             "|---|---|---|---|---|---|---|---|"]
    for label, executor, group, per_round, training, speedup, evaluation, accuracy in rows:
        lines.append(f"| {label} | {executor} | {group} | {per_round:.3f} | {training:.3f} | {speedup:.2f}x | "
                     f"{evaluation:.3f} | "
                     f"{accuracy:.4f} |")
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "table.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    print(f"\nwritten {opts.out / 'table.md'}")


if __name__ == "__main__":
    main()
