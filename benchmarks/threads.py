"""Seconds per round with one intra-op thread against torch's default (one per core), on a machine left
alone and beside busy processes (two per core unless ``--busy_per_core``): the measurements ``--threads``'s
default is chosen from.

    python benchmarks/threads.py                    # both parts; writes results/benchmarks/threads/table.md
    python benchmarks/threads.py --part models      # the model table only
    python benchmarks/threads.py --part quickstart  # the README's quickstart only
    python benchmarks/threads.py --part models --settings ResNet18 --out one-row.md   # one row again, elsewhere

models: for each model and input size the project runs, the time of one local SGD step at PFLlib's batch
of 10 (cross-entropy, forward, backward, update; convolutional models channels-last, as clients run them)
and of one no-gradient evaluation batch (256 samples, or a whole small client's split), each the median of
several after a warm-up. A round is then that dataset's usual split: every client runs one local epoch and
evaluates its train and test data. Python's per-round overhead (aggregation, FedLAG's scores) is left out:
it runs on one thread whatever the count.

quickstart: the README's quickstart command in a fresh process, wall time from start to exit, with its
default thread count (as printed), ``--threads 1`` and ``--threads <cores>`` (torch's default count).
Beside busy processes, torch's count runs ``-gr 10`` only: a whole run takes tens of minutes there.

"Busy": ``--busy_per_core`` ``python -c "while True: pass"`` per core, started by this script at its own
niceness and stopped after each measurement.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "system"), str(REPO)]  # an entry script: the project's packages

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from app.options import QUICKSTART  # noqa: E402
from dataset.utils.atomic_io import atomic_path  # noqa: E402
from flcore.trainmodel.models import CONVOLUTIONAL, TEXT_MODELS, build_model  # noqa: E402
from utils.result_utils import read_results, result_path  # noqa: E402

BATCH, EVAL_BATCH, LR = 10, 256, 0.005
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass(frozen=True)
class Setting:
    """A model on a dataset's inputs, and that dataset's usual split (PFLlib's 75/25 cut per client)."""
    label: str
    model: str
    shape: Tuple[int, ...]
    clients: int
    train: int            # training samples per client
    test: int             # test samples per client
    vocab: Optional[int] = None


SETTINGS = (
    Setting("Digits-iid-lg4 / CNN (quickstart), 40 clients", "CNN", (1, 8, 8), 40, 34, 11),
    Setting("MNIST / CNN, 20 clients", "CNN", (1, 28, 28), 20, 2625, 875),
    Setting("CIFAR-10 / CNN, 20 clients", "CNN", (3, 32, 32), 20, 2250, 750),
    Setting("CIFAR-10 / ResNet9, 20 clients", "ResNet9", (3, 32, 32), 20, 2250, 750),
    Setting("CIFAR-10 / ResNet18, 20 clients", "ResNet18", (3, 32, 32), 20, 2250, 750),
    Setting("AG_News / Transformer (200 tokens), 20 clients", "Transformer", (200,), 20, 4785, 1595, 32000),
)


# ----- the busy machine ------------------------------------------------------------------------------------
@contextmanager
def busy_cores(count: int) -> Iterator[None]:
    """``count`` processes spinning on one core each for as long as the block runs."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(1.0)  # let the scheduler spread them
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


@contextmanager
def condition(spinners: int) -> Iterator[None]:
    if spinners:
        with busy_cores(spinners):
            yield
    else:
        yield


# ----- the model table -------------------------------------------------------------------------------------
def median_seconds(work: Callable[[], None], repeats: int) -> float:
    work()  # warm-up: allocations, kernel choice
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def inputs(setting: Setting, count: int) -> torch.Tensor:
    if setting.model in TEXT_MODELS:
        return torch.randint(1, setting.vocab, (count, *setting.shape))
    x = torch.randn(count, *setting.shape)
    return x.contiguous(memory_format=torch.channels_last) if setting.model in CONVOLUTIONAL else x


def seconds_per_round(setting: Setting, repeats: int) -> float:
    """One round of ``setting`` on the current thread count: every client's local epoch and evaluation."""
    torch.manual_seed(0)
    model = build_model(setting.model, setting.shape, 10, vocab_size=setting.vocab)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = inputs(setting, BATCH), torch.randint(0, 10, (BATCH,))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    def evaluation(rows: int) -> Callable[[], None]:
        batch = inputs(setting, rows)

        def run() -> None:
            with torch.no_grad():
                model(batch)
        return run

    model.train()
    per_client = math.ceil(setting.train / BATCH) * median_seconds(step, repeats)
    model.eval()
    for split in (setting.train, setting.test):
        rows = min(split, EVAL_BATCH)
        per_client += split / rows * median_seconds(evaluation(rows), max(1, repeats // 2))
    return setting.clients * per_client


def load_average() -> str:
    """The machine's one-minute load average: how busy "left alone" really was."""
    return f"{os.getloadavg()[0]:.1f}"


def model_rows(repeats: int, spinners: int, only: Sequence[str] = ()) -> List[str]:
    rows = []
    for setting in [s for s in SETTINGS if not only or any(word in s.label for word in only)]:
        cells = []
        for busy in (False, True):
            with condition(spinners if busy else 0):
                timings, load = [], load_average()
                for threads in (1, CORES):
                    torch.set_num_threads(threads)
                    timings.append(seconds_per_round(setting, repeats))
            cells += [f"{timings[0]:.3g}", f"{timings[1]:.3g}", f"{timings[0] / timings[1]:.2f}x", load]
            print(f"{setting.label}, {'busy' if busy else 'left alone'} (load {load}): 1 thread {timings[0]:.3g} s, "
                  f"{CORES} threads {timings[1]:.3g} s", flush=True)
        rows.append(f"| {setting.label} | " + " | ".join(cells) + " |")
    return rows


# ----- the quickstart --------------------------------------------------------------------------------------
def quickstart(results: Path, goal: str, extra: Sequence[str] = ()) -> float:
    """Wall seconds of the quickstart command (plus ``extra``) in a fresh process."""
    command = [sys.executable, str(REPO / "system" / "main.py"), *QUICKSTART, "-go", goal,
               "--results_dir", str(results), *extra]
    environment = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=environment)
    return time.perf_counter() - start


def same_results(results: Path, goal_a: str, goal_b: str) -> bool:
    a, b = (read_results(result_path(results, "Digits-iid-lg4", "FedLAG", goal, 0))[0] for goal in (goal_a, goal_b))
    return all(np.array_equal(a[name], b[name]) for name in ("rs_test_acc", "rs_train_loss", "rs_test_auc"))


def quickstart_rows(spinners: int) -> List[str]:
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        results = Path(folder)
        quickstart(results, "warmup", ("-gr", "0"))  # builds Digits-iid-lg4 on first use, outside the timing
        for busy in (False, True):
            where = "busy" if busy else "left alone"
            with condition(spinners if busy else 0):
                load = load_average()
                default = quickstart(results, f"default-{where[:4]}")
                one = quickstart(results, f"one-{where[:4]}", ("--threads", "1"))
                rounds = ("-gr", "10") if busy else ()
                many = quickstart(results, f"many-{where[:4]}", ("--threads", str(CORES), *rounds))
            identical = same_results(results, f"default-{where[:4]}", f"one-{where[:4]}")
            many_cell = f"{many:.1f}" if not busy else f"{many:.1f} for 11 rounds ({many / 11:.2f} s/round)"
            rows.append(f"| {where} | {load} | {default:.1f} | {one:.1f} | {default / one:.2f}x | {many_cell} | "
                        f"{'yes' if identical else 'no'} |")
            print(rows[-1], flush=True)
    return rows


def header(spinners: int) -> List[str]:
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    return ["# Intra-op threads: one against torch's default (one per core)", "",
            "Command: `python benchmarks/threads.py` (`--part models` or `--part quickstart` for one table).",
            "", f"Machine: {CORES} cores, torch {torch.__version__}; load average before the run {load} "
            "(other jobs share the machine: \"left alone\" means no busy process started by the benchmark). "
            f"Busy: `python -c \"while True: pass\"`, {spinners // CORES} per core ({spinners}), beside the "
            "measurement. Load: the "
            "one-minute load average when a condition started.", ""]


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--part", choices=("models", "quickstart", "both"), default="both")
    cli.add_argument("--repeats", type=int, default=3, help="timed training steps per setting and condition")
    cli.add_argument("--busy_per_core", type=int, default=2, help="spinning processes per core when busy")
    cli.add_argument("--settings", nargs="+", default=(), metavar="WORD",
                     help="only the model rows whose setting names one of these (e.g. ResNet18)")
    cli.add_argument("--out", type=Path, default=REPO / "results" / "benchmarks" / "threads" / "table.md")
    opts = cli.parse_args()
    spinners = opts.busy_per_core * CORES
    lines = header(spinners)
    if opts.part in ("models", "both"):
        lines += ["## Seconds per round, from timed steps", "",
                  f"PFLlib's batch {BATCH}, one local epoch per client, evaluation of every client's train and "
                  f"test data in batches of {EVAL_BATCH}; the median of {opts.repeats} training steps.", "",
                  f"| setting | alone: 1 thread | alone: {CORES} threads | speed-up of {CORES} | load | "
                  f"busy: 1 thread | busy: {CORES} threads | speed-up of {CORES} | load |",
                  "|---|---|---|---|---|---|---|---|---|"]
        lines += model_rows(opts.repeats, spinners, opts.settings)
        lines.append("")
    if opts.part in ("quickstart", "both"):
        lines += ["## The quickstart, wall seconds from start to exit", "",
                  f"`python system/main.py {' '.join(QUICKSTART)}` (101 rounds), nothing exported.", "",
                  f"| machine | load | as printed | `--threads 1` | as printed / `--threads 1` | `--threads {CORES}` "
                  "(torch's default count) | same results as `--threads 1` |", "|---|---|---|---|---|---|---|"]
        lines += quickstart_rows(spinners)
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(opts.out) as tmp:
        Path(tmp).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"table in {opts.out.relative_to(REPO) if opts.out.is_relative_to(REPO) else opts.out}")


if __name__ == "__main__":
    main()
