"""Does FedLAG keep what it learns? Best, final and worst single-round drop, against the layer-split
baselines, under full and partial participation.

    python benchmarks/fedlag_stability.py                                  # the committed table
    python benchmarks/fedlag_stability.py --datasets MNIST --jr 0.2 --seeds 1 --rounds 10 --jobs 2 \
        --methods FedPer "FedLAG smoothed, module, K=1 (default)"

Setting: 20 clients, Dirichlet 0.1, ``-m CNN``, PFLlib's local training (batch 10, lr 0.005, one
epoch), on MNIST (all 70,000 images) and CIFAR-10 (the 20,000-image subset in ../shared/data), each
built offline from those files with the project's generators. Accuracy is PFLlib's (sample-weighted
over all clients' test sets, after the broadcast and before local training), evaluated every round.

Per run: ``best`` (max over rounds), ``final`` (last round), ``drop`` (largest fall from one
evaluation to the next after round 5: what a user loses by stopping at the wrong round). Cells are
mean ± std over seeds. FedLAG appears four times: the default (``smoothed`` schedule, module
granularity, K = 1), the same rule with K = 2, the paper's rule (``every_round``, tensor granularity,
K = 2) and the authors' rule (``warmup``, tensor granularity, K = 2). ``X+LAG`` runs use the default
rule; K counts X's own personal layers, so FedRep, FedROD and FedAS (personal heads) also run with
K = 2, one extra shared layer made personal. Ditto and Ditto+LAG run at PFLlib's shared ``-mu 0``,
where the personal models Ditto reports are Local training's whatever LAG does to the global model,
and at ``-mu 1``, where they are pulled towards it. Runs are skipped when their complete ``.h5``
exists, so an interrupted benchmark resumes. Writes ``table.md`` and ``curves_<data>.png`` next to
the runs.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "system"), str(REPO)]  # an entry script: the project's packages

from utils.result_utils import read_results, result_path  # noqa: E402

SHARED = REPO.parent / "shared" / "data"
SOURCES = {"MNIST": ("generate_MNIST.py", SHARED / "mnist-70k.npz"),
           "Cifar10": ("generate_Cifar10.py", SHARED / "cifar10-20k.npz")}
# label -> (-algo, extra flags, result tag). FedLAG's variants spell out every flag that defines them,
# so the table means the same thing whatever the defaults become.
PAPER = ("--lag_schedule", "every_round", "--lag_granularity", "tensor", "--lag_top_k", "2")
AUTHORS = ("--lag_schedule", "warmup", "--lag_granularity", "tensor", "--lag_top_k", "2")
SMOOTHED = ("--lag_schedule", "smoothed", "--lag_granularity", "module")
# PFLlib's shared values, which the FedDBE and Ditto runs were made with (each algorithm's own default differs:
# FedDBE -mo 1 -klw 50, Ditto -mu 1).
DBE_PFLLIB = ("-mo", "0.1", "-klw", "0")
DITTO_PFLLIB = ("-mu", "0")
METHODS: Dict[str, Tuple[str, Tuple[str, ...], str]] = {
    "FedAvg": ("FedAvg", (), "base"),
    "FedPer": ("FedPer", (), "base"),
    "FedRep": ("FedRep", (), "base"),
    "FedROD": ("FedROD", (), "base"),
    "FedAS": ("FedAS", (), "base"),
    "FedDBE": ("FedDBE", DBE_PFLLIB, "base"),
    # PFLlib's shared -mu 0 leaves Ditto's personal models unpulled: Local training, which LAG (acting on
    # the global model) cannot change. -mu 1 is in the middle of the grid Ditto's paper tunes over.
    "Ditto, mu=0 (Local)": ("Ditto", DITTO_PFLLIB, "base"),
    "Ditto, mu=1": ("Ditto", ("-mu", "1"), "mu1"),
    "FedLAG paper rule (every_round, tensor, K=2)": ("FedLAG", PAPER, "paper"),
    "FedLAG authors' rule (warmup, tensor, K=2)": ("FedLAG", AUTHORS, "authors"),
    "FedLAG smoothed, module, K=2": ("FedLAG", SMOOTHED + ("--lag_top_k", "2"), "k2"),
    "FedLAG smoothed, module, K=1 (default)": ("FedLAG", SMOOTHED + ("--lag_top_k", "1"), "k1"),
    # K counts the layers X keeps personal itself: with K = 1, X+LAG is X for the three methods whose
    # head is already personal; K = 2 adds one shared layer.
    "FedRep+LAG": ("FedRep+LAG", SMOOTHED + ("--lag_top_k", "1"), "k1"),
    "FedROD+LAG": ("FedROD+LAG", SMOOTHED + ("--lag_top_k", "1"), "k1"),
    "FedAS+LAG": ("FedAS+LAG", SMOOTHED + ("--lag_top_k", "1"), "k1"),
    "FedRep+LAG, K=2": ("FedRep+LAG", SMOOTHED + ("--lag_top_k", "2"), "k2"),
    "FedROD+LAG, K=2": ("FedROD+LAG", SMOOTHED + ("--lag_top_k", "2"), "k2"),
    "FedAS+LAG, K=2": ("FedAS+LAG", SMOOTHED + ("--lag_top_k", "2"), "k2"),
    "FedDBE+LAG": ("FedDBE+LAG", SMOOTHED + ("--lag_top_k", "1") + DBE_PFLLIB, "k1"),
    "Ditto+LAG, mu=0 (Local)": ("Ditto+LAG", SMOOTHED + ("--lag_top_k", "1") + DITTO_PFLLIB, "k1"),
    "Ditto+LAG, mu=1": ("Ditto+LAG", SMOOTHED + ("--lag_top_k", "1", "-mu", "1"), "k1mu1"),
}
DROP_AFTER = 5  # the first rounds move fast for every method; a drop there is not forgetting


def goal_of(label: str, jr: float) -> str:
    """The result-file tag of one method at one participation (no '_' or '+': the file name parses)."""
    return f"jr{jr:g}-{METHODS[label][2]}".replace(".", "p")


def ensure_dataset(name: str, data_dir: Path) -> str:
    folder = f"{name}-dir0.1"
    if not (data_dir / folder / "config.json").is_file():
        script, source = SOURCES[name]
        subprocess.run([sys.executable, str(REPO / "dataset" / script), "noniid", "-", "dir", "--alpha", "0.1",
                        "--num-clients", "20", "--source", str(source), "--name", folder, "--root", str(data_dir)],
                       check=True, stdout=subprocess.DEVNULL)
    return folder


def run_one(job: Tuple[str, str, float, int, int, Path, Path, Sequence[str]]) -> str:
    dataset, label, jr, seed, rounds, data_dir, out, extra = job
    algorithm, flags, _ = METHODS[label]
    goal = goal_of(label, jr)
    path = result_path(out, dataset, algorithm, goal, seed)
    if path.is_file() and read_results(path)[1].get("complete"):
        return f"kept {path.name}"
    cmd = [sys.executable, str(REPO / "system" / "main.py"), "-data", dataset, "-m", "CNN", "-algo", algorithm,
           "-gr", str(rounds), "-jr", str(jr), "-go", goal, "-dev", "cpu", "--threads", "1", "--seed", "0",
           "-pv", str(seed), "-t", str(seed + 1), "--data_dir", str(data_dir), "--results_dir", str(out),
           *flags, *extra]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return f"FAILED {' '.join(cmd[1:])}: {done.stderr.strip().splitlines()[-1:]}"
    return f"ran {path.name}"


def run_stats(acc: np.ndarray) -> Tuple[float, float, float]:
    """(best, final, worst single-round drop after round DROP_AFTER), in accuracy points."""
    acc = 100 * np.asarray(acc, dtype=float)
    falls = -np.diff(acc)[DROP_AFTER:]
    return float(acc.max()), float(acc[-1]), float(max(falls.max(), 0.0)) if falls.size else float("nan")


def cell(values: List[float], seeds: int) -> str:
    if not values:
        return "-"
    text = f"{np.mean(values):.1f}"
    return text + (f" ± {np.std(values):.1f}" if seeds > 1 else "")


def table(out: Path, datasets: Sequence[str], jrs: Sequence[float], seeds: int) -> Tuple[str, dict]:
    curves: dict = {}
    header = "| method | " + " | ".join(f"{d} jr {jr:g}: best / final / drop" for d in datasets for jr in jrs) + " |"
    lines = [header, "|---" * (1 + len(datasets) * len(jrs)) + "|"]
    for label, (algorithm, _, _) in METHODS.items():
        cells = []
        for dataset in datasets:
            for jr in jrs:
                stats, accs = [], []
                for seed in range(seeds):
                    path = result_path(out, dataset, algorithm, goal_of(label, jr), seed)
                    if path.is_file() and read_results(path)[1].get("complete"):
                        acc = read_results(path)[0]["rs_test_acc"]
                        stats.append(run_stats(acc))
                        accs.append(acc)
                if accs:
                    curves[(dataset, jr, label)] = np.mean(accs, axis=0)
                best, final, drop = (list(v) for v in zip(*stats)) if stats else ([], [], [])
                n = len(stats)
                cells.append(f"{cell(best, n)} / {cell(final, n)} / {cell(drop, n)}" + (f" ({n})" if n != seeds else ""))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines), curves


def plot(curves: dict, out: Path, datasets: Sequence[str], jrs: Sequence[float]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    for dataset in datasets:
        fig, axes = plt.subplots(1, len(jrs), figsize=(6 * len(jrs), 4), squeeze=False)
        for ax, jr in zip(axes[0], jrs):
            for index, label in enumerate(METHODS):
                acc = curves.get((dataset, jr, label))
                if acc is None or "+LAG" in label or label.startswith("Ditto, mu=0"):
                    continue
                style = "-" if label.startswith("FedLAG") else ":"
                ax.plot(100 * acc, style, label=label, color=f"C{index % 10}",  # one colour per method in every panel
                        linewidth=2 if label.endswith("(default)") else 1)
            ax.set_title(f"{dataset}, Dirichlet 0.1, jr {jr:g} (mean over seeds)")
            ax.set_xlabel("round")
            ax.set_ylabel("test accuracy (%)")
            ax.grid(alpha=0.3)
        axes[0][-1].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"curves_{dataset}.png", dpi=90)
        plt.close(fig)


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--datasets", nargs="+", default=list(SOURCES), choices=list(SOURCES))
    cli.add_argument("--jr", nargs="+", type=float, default=[1.0, 0.2])
    cli.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS), metavar="METHOD")
    cli.add_argument("--seeds", type=int, default=3)
    cli.add_argument("--rounds", type=int, default=20)
    cli.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 1)))
    cli.add_argument("--data_dir", type=Path, default=REPO / "dataset")
    cli.add_argument("--out", type=Path, default=REPO / "results" / "benchmarks" / "fedlag-stability")
    cli.add_argument("--table_only", action="store_true", help="only rebuild the table and plots from the runs")
    opts, extra = cli.parse_known_args()

    opts.out.mkdir(parents=True, exist_ok=True)
    datasets = [ensure_dataset(name, opts.data_dir) for name in opts.datasets]
    if not opts.table_only:
        # Cheap cells first, so a budget that runs out leaves whole rows rather than none.
        jobs = [(d, label, jr, seed, opts.rounds, opts.data_dir, opts.out, extra)
                for seed in range(opts.seeds) for jr in sorted(opts.jr) for d in datasets for label in opts.methods]
        with concurrent.futures.ThreadPoolExecutor(opts.jobs) as pool:
            for message in pool.map(run_one, jobs):
                print(message, flush=True)
    text, curves = table(opts.out, datasets, sorted(opts.jr, reverse=True), opts.seeds)
    (opts.out / "table.md").write_text(
        f"{opts.rounds + 1} evaluations (rounds 0..{opts.rounds}); accuracy in %, mean ± std over "
        f"{opts.seeds} seeds (a count in brackets: seeds available); drop = largest fall between two "
        f"consecutive rounds after round {DROP_AFTER}.\n\n{text}\n", encoding="utf-8")
    plot(curves, opts.out, datasets, sorted(opts.jr, reverse=True))
    print(text)


if __name__ == "__main__":
    main()
