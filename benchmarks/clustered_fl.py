"""Clustered FL's own methods (IFCA, CFL) on Digits under concept shift, against FedAvg and FedPer.

    python benchmarks/clustered_fl.py            # seed 0, writes results/benchmarks/clustered-fl/

Setting: ``-data Digits-iid-lg4 -nc 40 -lr 0.05 -gr 100`` (CNN), the README's concept-shift split: client
i sees the labels through group (i % 4)'s permutation. Per method: best and final accuracy, and for the
clustered methods the adjusted Rand index of the clusters at the last evaluation against the true
groups (1: the four groups exactly; about 0: no better than chance), with the number of clusters.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
from sklearn.metrics import adjusted_rand_score

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "system"), str(REPO)]  # an entry script: the project's packages
sys.path.insert(0, str(REPO / "benchmarks"))

from fedlag_stability import cell  # noqa: E402
from utils.result_utils import read_results, result_path  # noqa: E402

DATASET = "Digits-iid-lg4"
GROUPS = 4
SETTING = ("-nc", "40", "-lr", "0.05", "-gr", "100")
METHODS = {"FedAvg": ("FedAvg", ()), "FedPer": ("FedPer", ()), "IFCA": ("IFCA", ()),
           "IFCA, weight sharing": ("IFCA", ("--ifca_share_base",)), "CFL": ("CFL", ()),
           # The absolute rule with the bounds measured here before the relative rule became the default.
           "CFL, absolute rule": ("CFL", ("--cfl_rule", "absolute", "--cfl_warmup", "20"))}


def goal_of(label: str) -> str:
    return "sharebase" if "sharing" in label else "absolute" if "absolute" in label else "clustered"


def run(label: str, seed: int, data_dir: Path, out: Path) -> dict:
    algorithm, flags = METHODS[label]
    path = result_path(out, DATASET, algorithm, goal_of(label), seed)
    if not (path.is_file() and read_results(path)[1].get("complete")):
        subprocess.run([sys.executable, str(REPO / "system" / "main.py"), "-algo", algorithm, "-data", DATASET,
                        *SETTING, *flags, "-go", goal_of(label), "--threads", "1", "-dev", "cpu", "--seed", "0",
                        "-pv", str(seed), "-t", str(seed + 1), "--data_dir", str(data_dir),
                        "--results_dir", str(out)], check=True, stdout=subprocess.DEVNULL)
    return read_results(path)[0]


def cluster_stats(clusters: np.ndarray) -> tuple:
    """(adjusted Rand index against client i's group i % GROUPS, number of clusters)."""
    truth = np.arange(len(clusters)) % GROUPS
    return float(adjusted_rand_score(truth, clusters)), len(set(clusters.tolist()))


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--seeds", type=int, default=1)
    cli.add_argument("--data_dir", type=Path, default=REPO / "dataset")
    cli.add_argument("--out", type=Path, default=REPO / "results" / "benchmarks" / "clustered-fl")
    args = cli.parse_args()
    lines = [f"`{DATASET} {' '.join(SETTING)}`, {args.seeds} seed(s): best / final accuracy (%), and the adjusted "
             "Rand index of the final clusters against the true groups", "",
             "| method | best | final | ARI | clusters |", "|---|---|---|---|---|"]
    for label in METHODS:
        arrays = [run(label, seed, args.data_dir, args.out) for seed in range(args.seeds)]
        best = [100 * float(a["rs_test_acc"].max()) for a in arrays]
        final = [100 * float(a["rs_test_acc"][-1]) for a in arrays]
        if "cluster_of_client" in arrays[0]:
            ari, count = zip(*(cluster_stats(a["cluster_of_client"][-1]) for a in arrays))
            spread = f" ± {np.std(ari):.2f}" if args.seeds > 1 else ""
            clusters = f"{np.mean(ari):.2f}{spread} | {cell(list(count), args.seeds)}"
        else:
            clusters = "- | -"
        lines.append(f"| {label} | {cell(best, args.seeds)} | {cell(final, args.seeds)} | {clusters} |")
        print(lines[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
