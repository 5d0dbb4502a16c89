"""The embedded dataset that shows what FedLAG is for: Digits under concept shift.

    python benchmarks/embedded_demo.py            # 3 seeds, writes results/benchmarks/embedded-demo/

Setting (the README's second quickstart command): ``-data Digits-iid-lg4 -nc 40 -lr 0.05 -gr 100``.
Scikit-learn's Digits (embedded, built on first use) over 40 clients, IID images, four label groups:
client i sees the labels through group (i % 4)'s fixed permutation (clustered FL's label swap). The
images mean the same to everyone, the labels do not: the head's updates conflict, the features'
do not. FedAvg must fit four label maps with one head; Local has about 33 training images per client
for 10 classes; a method that shares the features and keeps the conflicting layer should beat both.

Per run: best, final and worst single-round drop after round 5, as in ``fedlag_stability.py``; cells
are mean ± std over seeds (seed s: ``--seed 0 -pv s -t s+1``, the model seed; the split is fixed).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "system"), str(REPO)]  # an entry script: the project's packages
sys.path.insert(0, str(REPO / "benchmarks"))

from fedlag_stability import cell, run_stats  # noqa: E402
from utils.result_utils import read_results, result_path  # noqa: E402

DATASET = "Digits-iid-lg4"
SETTING = ("-nc", "40", "-lr", "0.05", "-gr", "100")
METHODS = {"FedAvg": (), "Local": (), "FedPer": (), "FedRep": (), "FedROD": (), "FedLAG (default)": (),
           "FedLAG paper rule": ("--lag_schedule", "every_round", "--lag_granularity", "tensor",
                                 "--lag_top_k", "2")}


def algorithm_of(label: str) -> str:
    return label.split(" ")[0]


def goal_of(label: str) -> str:
    return "demo-paper" if "paper" in label else "demo"


def run(label: str, seed: int, data_dir: Path, out: Path) -> np.ndarray:
    path = result_path(out, DATASET, algorithm_of(label), goal_of(label), seed)
    if not (path.is_file() and read_results(path)[1].get("complete")):
        subprocess.run([sys.executable, str(REPO / "system" / "main.py"), "-algo", algorithm_of(label),
                        "-data", DATASET, *SETTING, *METHODS[label], "-go", goal_of(label), "--threads", "1",
                        "-dev", "cpu", "--seed", "0", "-pv", str(seed), "-t", str(seed + 1),
                        "--data_dir", str(data_dir), "--results_dir", str(out)],
                       check=True, stdout=subprocess.DEVNULL)
    return read_results(path)[0]["rs_test_acc"]


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--seeds", type=int, default=3)
    cli.add_argument("--data_dir", type=Path, default=REPO / "dataset")
    cli.add_argument("--out", type=Path, default=REPO / "results" / "benchmarks" / "embedded-demo")
    args = cli.parse_args()
    lines = [f"`{DATASET} {' '.join(SETTING)}`, {args.seeds} seeds: best / final / worst drop after round 5",
             "", "| method | best | final | worst drop |", "|---|---|---|---|"]
    for label in METHODS:
        stats = [run_stats(run(label, seed, args.data_dir, args.out)) for seed in range(args.seeds)]
        best, final, drop = (list(v) for v in zip(*stats))
        lines.append(f"| {label} | {cell(best, args.seeds)} | {cell(final, args.seeds)} | {cell(drop, args.seeds)} |")
        print(lines[-1], flush=True)
    (args.out / "table.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
