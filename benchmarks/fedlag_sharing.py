"""Whether a personal layer should be kept, shared within a group or shared with all, on the embedded splits:
FedPer, FedLAG's group sharing and its per-client check, side by side.

    python benchmarks/fedlag_sharing.py                        # 10 seeds, every split and rule, --jobs 2
    python benchmarks/fedlag_sharing.py --methods "FedLAG check" --splits quickstart --seeds 3

Splits (the embedded Digits, built on first use): the quickstart's concept shift (``Digits-iid-lg4 -nc 40
-lr 0.05 -gr 100``; four label groups, client i in group i % 4), the same at ``-jr 0.2``, and the
default split's label skew (``Digits -gr 30``) at ``-jr 0.2`` and ``-jr 0.5``. Seed s is ``--seed s`` (the
split is fixed; the seed moves the model's initialisation and the sampling).

Rules: ``FedLAG groups`` shares the personal layer within the groups the update profiles form;
``FedLAG check`` lets each client take, of its own copy, its group's and everyone's, the one of lowest loss
on the 10% of its training data it holds out (``--val_ratio 0.1``); ``FedLAG check (train data)`` makes
the same check on its training data instead (no data held out, but its own copy was fitted to it).

Per cell: best, final and worst single-round drop after round 5 (PFLlib's sample-weighted accuracy), the
final accuracy as the mean over clients, the share of clients on each copy at the end (check rules), and
the adjusted Rand index of the final groups against the true ones (concept shift). Runs whose complete
``.h5`` exists are kept, so an interrupted call resumes; the table is written from every run present.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "system"), str(REPO)]  # an entry script: the project's packages
sys.path.insert(0, str(REPO / "benchmarks"))

from fedlag_stability import cell, run_stats  # noqa: E402
from run_jobs import run_jobs  # noqa: E402
from shift_study import adjusted_rand, copies_taken, final_groups  # noqa: E402
from utils.accuracy_summary import summary_from_arrays  # noqa: E402
from utils.result_utils import read_results, result_path  # noqa: E402

# split -> (dataset, flags, whether its clients form the four groups i % 4)
SPLITS: Dict[str, Tuple[str, Tuple[str, ...], bool]] = {
    "quickstart": ("Digits-iid-lg4", ("-nc", "40", "-lr", "0.05", "-gr", "100"), True),
    "quickstart -jr 0.2": ("Digits-iid-lg4", ("-nc", "40", "-lr", "0.05", "-gr", "100", "-jr", "0.2"), True),
    "label skew -jr 0.2": ("Digits", ("-gr", "30", "-jr", "0.2"), False),
    "label skew -jr 0.5": ("Digits", ("-gr", "30", "-jr", "0.5"), False),
}
# label -> (-algo, extra flags, result tag)
METHODS: Dict[str, Tuple[str, Tuple[str, ...], str]] = {
    "FedPer": ("FedPer", (), "fedper"),
    "FedLAG groups": ("FedLAG", ("--lag_share", "groups"), "groups"),
    "FedLAG check": ("FedLAG", ("--lag_share", "check", "--val_ratio", "0.1"), "check"),
    "FedLAG check (train data)": ("FedLAG", ("--lag_share", "check", "--lag_check_data", "train"), "checktrain"),
    "FedLAG": ("FedLAG", (), "default"),
    "FedLAG sketch": ("FedLAG", ("--lag_upload", "sketch"), "sketch"),
}


def goal_of(split: str, label: str, seed: int) -> str:
    """One goal per split, rule and seed (``--seed s`` runs index 0): ``quickstart-jr0p2-check-s3``."""
    return f"{split.replace(' ', '').replace('.', 'p')}-{METHODS[label][2]}-s{seed}"


def path_of(out: Path, split: str, label: str, seed: int) -> Path:
    return result_path(out, SPLITS[split][0], METHODS[label][0], goal_of(split, label, seed), 0)


def complete(path: Path) -> Optional[dict]:
    if not path.is_file():
        return None
    arrays, attrs = read_results(path)
    return arrays if attrs.get("complete") else None


def run_one(job: Tuple[str, str, int, Path, Path]) -> str:
    split, label, seed, data_dir, out = job
    path = path_of(out, split, label, seed)
    if complete(path) is not None:
        return f"kept {path.name}"
    dataset, flags, _ = SPLITS[split]
    algorithm, extra, _ = METHODS[label]
    cmd = [sys.executable, str(REPO / "system" / "main.py"), "-algo", algorithm, "-data", dataset, *flags, *extra,
           "-go", goal_of(split, label, seed), "--seed", str(seed),
           "--threads", "1", "-dev", "cpu", "--data_dir", str(data_dir), "--results_dir", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return f"FAILED {' '.join(cmd[1:])}: {done.stderr.strip().splitlines()[-1:]}"
    return f"ran {path.name}"


def table(out: Path, seeds: int) -> str:
    lines = [f"Embedded Digits splits, seeds 0..{seeds - 1} (`--seed s`): best / final / worst drop after round 5 "
             "(sample-weighted, as PFLlib), final as the mean over clients, copies taken at the end, adjusted "
             "Rand index of the final groups (concept shift)", ""]
    for split, (dataset, flags, grouped) in SPLITS.items():
        rows = []
        for label in METHODS:
            runs = [a for a in (complete(path_of(out, split, label, s)) for s in range(seeds)) if a is not None]
            if not runs:
                continue
            n = len(runs)
            best, final, drop = (list(v) for v in zip(*(run_stats(a["rs_test_acc"]) for a in runs)))
            client_mean = [100 * summary_from_arrays(a).final_client_mean for a in runs]
            copies = copies_taken(runs).removeprefix("; copies ") if "lag_copies" in runs[0] else ""
            found = [g for g in (final_groups(a) for a in runs) if g is not None]
            ari = cell([adjusted_rand(g) for g in found], len(found)) if grouped and found else ""
            seeds_note = f" ({n} seed{'s' if n > 1 else ''})" if n != seeds else ""
            rows.append(f"| {label}{seeds_note} | {cell(best, n)} | {cell(final, n)} | {cell(drop, n)} | "
                        f"{cell(client_mean, n)} | {copies} | {ari} |")
        if rows:
            lines += [f"### {split}: `-data {dataset} {' '.join(flags)}`", "",
                      "| method | best | final | worst drop | final, mean over clients | copies | adjusted Rand index |",
                      "|---|---|---|---|---|---|---|", *rows, ""]
    return "\n".join(lines)


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--seeds", type=int, default=10)
    cli.add_argument("--splits", nargs="+", default=list(SPLITS), choices=list(SPLITS), metavar="SPLIT")
    cli.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS), metavar="METHOD")
    cli.add_argument("--jobs", type=int, default=2)
    cli.add_argument("--data_dir", type=Path, default=REPO / "dataset")
    cli.add_argument("--out", type=Path, default=REPO / "results" / "benchmarks" / "fedlag-sharing")
    cli.add_argument("--table_only", action="store_true", help="write table.md from the runs present")
    args = cli.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.table_only:
        jobs: List[Tuple] = [(split, label, seed, args.data_dir, args.out) for seed in range(args.seeds)
                             for split in args.splits for label in args.methods]
        run_jobs(run_one, jobs, args.jobs)
    (args.out / "table.md").write_text(table(args.out, args.seeds), encoding="utf-8")
    print((args.out / "table.md").read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
