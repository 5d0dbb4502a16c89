"""FedLAG's default with few uploads a round: 12 seeds on the embedded default split, against FedPer.

    python benchmarks/fedlag_few_uploads.py            # writes results/benchmarks/fedlag-few-uploads/

Setting: what a new user runs, ``python system/main.py -algo X -gr 30 --seed s -jr J``: the default
dataset (scikit-learn's Digits, 20 clients, Dirichlet 0.1, about 67 training images of one or two
digits each), the CNN, PFLlib's local training, 31 evaluations, at ``-jr 0.2`` (4 uploads, 6 pairs a
round) and ``-jr 0.5`` (10 uploads, 45 pairs). ``--seed s`` seeds the model and client sampling; the
split is fixed. Small data with few uploads is where a rule that acts on one round of noise shows.

Per run: best, final and worst single-round drop after round 5 (``fedlag_stability.py``'s
statistics), and for FedLAG the layers it kept personal, as ``layer@round`` each time the choice
changed. A seed passes when FedLAG's final is at least FedPer's final - 1 point and its worst drop at
most FedPer's + 2 points. Runs are skipped when their complete ``.h5`` exists. Writes ``table.md``.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "system"), str(REPO)]  # an entry script: the project's packages
sys.path.insert(0, str(REPO / "benchmarks"))

from fedlag_stability import cell, run_stats  # noqa: E402
from utils.result_utils import read_results, result_path  # noqa: E402

DATASET = "Digits"
ROUNDS = 30
# label -> (-algo, extra flags, result tag)
METHODS: Dict[str, Tuple[str, Tuple[str, ...], str]] = {
    "FedAvg": ("FedAvg", (), "few"),
    "FedPer": ("FedPer", (), "few"),
    "FedRep": ("FedRep", (), "few"),
    "FedLAG (default)": ("FedLAG", (), "few"),
    "FedLAG paper rule": ("FedLAG", ("--lag_schedule", "every_round", "--lag_granularity", "tensor",
                                     "--lag_top_k", "2"), "few-paper"),
}
REFERENCE, SUBJECT = "FedPer", "FedLAG (default)"


def goal_of(label: str, jr: float) -> str:
    return f"{METHODS[label][2]}-jr{jr:g}".replace(".", "p")


def run(job: Tuple[str, float, int, Path, Path]) -> Path:
    label, jr, seed, data_dir, out = job
    algorithm, flags, _ = METHODS[label]
    folder = out / f"seed{seed}"
    path = result_path(folder, DATASET, algorithm, goal_of(label, jr), 0)
    if not (path.is_file() and read_results(path)[1].get("complete")):
        subprocess.run([sys.executable, str(REPO / "system" / "main.py"), "-algo", algorithm, "-gr", str(ROUNDS),
                        "--seed", str(seed), "-jr", str(jr), *flags, "-go", goal_of(label, jr), "--threads", "1",
                        "-dev", "cpu", "--data_dir", str(data_dir), "--results_dir", str(folder)],
                       check=True, stdout=subprocess.DEVNULL)
    return path


def choices(arrays: Dict[str, np.ndarray]) -> str:
    """``head@0``, or ``conv2@0 head@4``: the personal layers each time the choice changed (made at the end of
    that round, in force from the next broadcast)."""
    names = [str(n).split(".")[-2] if str(n).count(".") > 1 else str(n) for n in arrays["lag_layer_names"]]
    changes, last = [], None
    for rnd, row in enumerate(arrays["lag_personal"]):
        chosen = "+".join(names[i] for i in np.flatnonzero(row)) or "none"
        if chosen != last:
            changes.append(f"{chosen}@{rnd}")
            last = chosen
    return " ".join(changes)


def jr_table(jr: float, seeds: Sequence[int], data_dir: Path, out: Path) -> List[str]:
    runs = {(label, seed): read_results(run((label, jr, seed, data_dir, out)))[0]
            for label in METHODS for seed in seeds}
    stats = {key: run_stats(arrays["rs_test_acc"]) for key, arrays in runs.items()}
    lines = [f"### `-jr {jr:g}`", "", f"| seed | {REFERENCE} final / drop | {SUBJECT} final / drop | passes | "
             f"{SUBJECT}: personal layers@round |", "|---|---|---|---|---|"]
    passed = 0
    for seed in seeds:
        (_, ref_final, ref_drop), (_, final, drop) = stats[(REFERENCE, seed)], stats[(SUBJECT, seed)]
        ok = final >= ref_final - 1 and drop <= ref_drop + 2
        passed += ok
        lines.append(f"| {seed} | {ref_final:.1f} / {ref_drop:.1f} | {final:.1f} / {drop:.1f} | "
                     f"{'yes' if ok else '**no**'} | {choices(runs[(SUBJECT, seed)])} |")
    lines += ["", f"{passed} of {len(seeds)} seeds pass. Over the seeds (mean ± std):", "",
              "| method | best | final | worst drop |", "|---|---|---|---|"]
    for label in METHODS:
        best, final, drop = (list(v) for v in zip(*(stats[(label, seed)] for seed in seeds)))
        lines.append(f"| {label} | {cell(best, len(seeds))} | {cell(final, len(seeds))} | "
                     f"{cell(drop, len(seeds))} |")
    return lines + [""]


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--seeds", type=int, default=12)
    cli.add_argument("--jr", nargs="+", type=float, default=[0.2, 0.5])
    cli.add_argument("--jobs", type=int, default=2)
    cli.add_argument("--data_dir", type=Path, default=REPO / "dataset")
    cli.add_argument("--out", type=Path, default=REPO / "results" / "benchmarks" / "fedlag-few-uploads")
    args = cli.parse_args()
    seeds = list(range(args.seeds))
    # The default split is built on first use: once, before the runs that would race to build it.
    run((REFERENCE, args.jr[0], seeds[0], args.data_dir, args.out))
    jobs = [(label, jr, seed, args.data_dir, args.out) for jr in args.jr for seed in seeds for label in METHODS]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(run, jobs))
    lines = [f"`python system/main.py -algo X -gr {ROUNDS} --seed s -jr J` on the default split ({DATASET}: 20 "
             f"clients, Dirichlet 0.1), seeds 0-{seeds[-1]}; accuracy in %; drop = largest fall between two "
             f"consecutive rounds after round 5. A seed passes when {SUBJECT}'s final >= {REFERENCE}'s - 1 and "
             f"its drop <= {REFERENCE}'s + 2.", ""]
    for jr in args.jr:
        lines += jr_table(jr, seeds, args.data_dir, args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
