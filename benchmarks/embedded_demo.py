"""The embedded dataset that shows what FedLAG is for: Digits under concept shift.

    python benchmarks/embedded_demo.py            # 3 seeds, writes results/benchmarks/embedded-demo/

Setting (the README's second quickstart command): ``-data Digits-iid-lg4 -nc 40 -lr 0.05 -gr 100``.
Scikit-learn's Digits (embedded, built on first use) over 40 clients, IID images, four label groups:
client i sees the labels through group (i % 4)'s fixed permutation (clustered FL's label swap). The
images mean the same to everyone, the labels do not: the head's updates conflict, the features'
do not. FedAvg must fit four label maps with one head; Local has 17-21 training images per client for 10
classes (client 39 has 612: PFLlib's unbalanced IID split gives the last client what the others leave); a
method that shares the features and keeps the conflicting layer should beat both.

Per run: best, final and worst single-round drop after round 5, as in ``fedlag_stability.py``, from
PFLlib's sample-weighted accuracy (where client 39 holds 204 of the 462 test images), and the final
accuracy as the mean over clients (every client weighted alike); cells are mean ± std over seeds (seed s:
``--seed 0 -pv s -t s+1``, the model seed; the split is fixed).
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
from utils.accuracy_summary import summary_from_arrays  # noqa: E402
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


def run(label: str, seed: int, data_dir: Path, out: Path) -> dict:
    path = result_path(out, DATASET, algorithm_of(label), goal_of(label), seed)
    if not (path.is_file() and read_results(path)[1].get("complete")):
        subprocess.run([sys.executable, str(REPO / "system" / "main.py"), "-algo", algorithm_of(label),
                        "-data", DATASET, *SETTING, *METHODS[label], "-go", goal_of(label), "--threads", "1",
                        "-dev", "cpu", "--seed", "0", "-pv", str(seed), "-t", str(seed + 1),
                        "--data_dir", str(data_dir), "--results_dir", str(out)],
                       check=True, stdout=subprocess.DEVNULL)
    return read_results(path)[0]


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--seeds", type=int, default=3)
    cli.add_argument("--data_dir", type=Path, default=REPO / "dataset")
    cli.add_argument("--out", type=Path, default=REPO / "results" / "benchmarks" / "embedded-demo")
    args = cli.parse_args()
    lines = [f"`{DATASET} {' '.join(SETTING)}`, {args.seeds} seeds: best / final / worst drop after round 5 "
             f"(sample-weighted, as PFLlib), and the final accuracy as the mean over clients", "",
             "| method | best | final | worst drop | final, mean over clients |", "|---|---|---|---|---|"]
    for label in METHODS:
        runs = [run(label, seed, args.data_dir, args.out) for seed in range(args.seeds)]
        best, final, drop = (list(v) for v in zip(*(run_stats(arrays["rs_test_acc"]) for arrays in runs)))
        client_mean = [100 * summary_from_arrays(arrays).final_client_mean for arrays in runs]
        lines.append(f"| {label} | {cell(best, args.seeds)} | {cell(final, args.seeds)} | {cell(drop, args.seeds)} "
                     f"| {cell(client_mean, args.seeds)} |")
        print(lines[-1], flush=True)
    (args.out / "table.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
