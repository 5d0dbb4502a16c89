"""FedLAG against FedAvg on real data, and FedLAG's schedule x K sweep.

    python benchmarks/fedlag_accuracy.py --rounds 20 --seeds 3          # the comparison
    python benchmarks/fedlag_accuracy.py --rounds 20 --sweep            # + schedules x K on CIFAR-10

Setting (issue "FedLAG and the LayerConflictMixin"): 20 clients, Dirichlet 0.1, ``-m CNN``, PFLlib's
defaults otherwise (batch 10, lr 0.005, 1 local epoch, full participation), on MNIST (all 70,000 images)
and CIFAR-10 (the 20,000-image subset in ../shared/data). Accuracy is PFLlib's: sample-weighted over
all clients' test sets, after the broadcast and before local training; "best" is the maximum over
rounds (PFLlib's headline), "final" the last evaluation. Runs go through ``system/main.py`` with
``-t`` seeds (run i uses seed i) and write their .h5 under ``--out``; the table is printed as Markdown.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "system"), str(REPO)]  # an entry script: the project's packages

from utils.result_utils import read_results, result_path  # noqa: E402

SHARED = REPO.parent / "shared" / "data"
DATASETS = {"MNIST": ("generate_MNIST.py", SHARED / "mnist-70k.npz"),
            "Cifar10": ("generate_Cifar10.py", SHARED / "cifar10-20k.npz")}


def ensure_dataset(name: str) -> str:
    """Build ``<name>-dir0.1`` (20 clients, Dirichlet 0.1) from the local copy if it is missing."""
    folder = f"{name}-dir0.1"
    if not (REPO / "dataset" / folder / "config.json").is_file():
        script, source = DATASETS[name]
        subprocess.run([sys.executable, str(REPO / "dataset" / script), "noniid", "-", "dir", "--alpha", "0.1",
                        "--num-clients", "20", "--source", str(source), "--name", folder], check=True)
    return folder


def run(dataset: str, algorithm: str, goal: str, rounds: int, seeds: int, out: Path, *extra: str) -> None:
    files = [result_path(out, dataset, algorithm, goal, i) for i in range(seeds)]
    if all(f.is_file() and read_results(f)[1].get("complete") for f in files):
        return  # already done: the benchmark resumes where it stopped
    cmd = [sys.executable, str(REPO / "system" / "main.py"), "-data", dataset, "-m", "CNN", "-algo", algorithm,
           "-gr", str(rounds), "-t", str(seeds), "-go", goal, "-dev", "cpu", "--results_dir", str(out), *extra]
    print("$", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def summary(dataset: str, algorithm: str, goal: str, seeds: int, out: Path) -> str:
    best, final, seconds = [], [], []
    for i in range(seeds):
        arrays, _ = read_results(result_path(out, dataset, algorithm, goal, i))
        best.append(arrays["rs_test_acc"].max())
        final.append(arrays["rs_test_acc"][-1])
        seconds.append(arrays["rs_round_time"].mean())
    return (f"{100 * np.mean(best):.2f} ± {100 * np.std(best):.2f} | {100 * np.mean(final):.2f} ± "
            f"{100 * np.std(final):.2f} | {np.mean(seconds):.1f}")


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--rounds", type=int, default=20)
    cli.add_argument("--seeds", type=int, default=3)
    cli.add_argument("--sweep", action="store_true", help="also schedules x K on CIFAR-10 (seed 0)")
    cli.add_argument("--out", type=Path, default=REPO / "results" / "benchmarks" / "fedlag")
    opts = cli.parse_args()

    rows = []
    for name in DATASETS:
        dataset = ensure_dataset(name)
        for algorithm in ("FedAvg", "FedLAG"):
            run(dataset, algorithm, "cmp", opts.rounds, opts.seeds, opts.out)
            rows.append(f"| {dataset} | {algorithm} | {summary(dataset, algorithm, 'cmp', opts.seeds, opts.out)} |")
    print(f"\n{opts.rounds + 1} evaluations, {opts.seeds} seeds; accuracy % (mean ± std over seeds)\n")
    print("| data | algorithm | best | final | s/round |\n|---|---|---|---|---|")
    print("\n".join(rows))

    if opts.sweep:
        dataset = ensure_dataset("Cifar10")
        sweep = []
        for schedule in ("every_round", "warmup"):
            for k in (1, 2, 5):
                goal = f"{schedule}-k{k}"
                run(dataset, "FedLAG", goal, opts.rounds, 1, opts.out, "--lag_schedule", schedule,
                    "--lag_top_k", str(k))
                sweep.append(f"| {schedule} | tensor | {k} | {summary(dataset, 'FedLAG', goal, 1, opts.out)} |")
            # Module granularity scores a layer's weight and bias together: the fix for bias-only picks.
            goal = f"{schedule}-module-k2"
            run(dataset, "FedLAG", goal, opts.rounds, 1, opts.out, "--lag_schedule", schedule,
                "--lag_top_k", "2", "--lag_granularity", "module")
            sweep.append(f"| {schedule} | module | 2 | {summary(dataset, 'FedLAG', goal, 1, opts.out)} |")
        print(f"\nFedLAG on {dataset}, seed 0: schedule x granularity x K (warm-up W = min(gr // 2, 30))\n")
        print("| schedule | granularity | K | best | final | s/round |\n|---|---|---|---|---|---|")
        print("\n".join(sweep))


if __name__ == "__main__":
    main()
