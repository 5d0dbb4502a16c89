"""Does a refactoring change any result? Runs a fixed set of runs on an earlier commit and on the
working tree, and compares every array of their ``.h5`` files bit for bit.

    python benchmarks/same_results.py                 # against HEAD (commit first, then refactor)
    python benchmarks/same_results.py --before v1.0   # against any commit
    python benchmarks/same_results.py --wide          # also every other exchange path (one seed each)

The set (issue 15): FedAvg, FedLAG, FedRep+LAG, Ditto+LAG, SCAFFOLD, FedALA, FedBABU, MOON and FedProto
on the embedded Digits, ``-gr 3``, two seeds each, plus one FedLAG run with ``--executor ray`` when Ray
is installed. ``--wide`` adds one run of each algorithm whose upload carries more than parameters, or
whose training or evaluation has its own path (:data:`WIDE`). Every run uses ``--threads 1`` on the CPU, so both sides do the same float operations.
Exit status 0 when every array is identical, 1 otherwise (the differing arrays are listed).
"""
from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Tuple

import h5py
import numpy as np

REPO = Path(__file__).resolve().parents[1]
ALGORITHMS = ("FedAvg", "FedLAG", "FedRep+LAG", "Ditto+LAG", "SCAFFOLD", "FedALA", "FedBABU", "MOON", "FedProto")
SEEDS = (0, 1)
COMMON = ("-data", "Digits", "-gr", "3", "-dev", "cpu", "--threads", "1")
# One seed each: uploads with extras (control deltas, prototypes, Fisher traces, heads, download
# weights), multi-stage training, -cdr drop-out, FedLAG's last_batch signal and the batched engine.
# (The flags after a name are those a method needs on this small run: tests/conftest.py METHOD_FLAGS.)
WIDE = (("FedPAC",), ("FedAS",), ("FedAS+LAG",), ("FedGH",), ("FedFomo",), ("FedCP",), ("FD",),
        ("PerAvg", "-bt", "0.05"), ("pFedMe", "-bt", "1", "-K", "2", "-lam", "1", "-lrp", "0.01"), ("FedRep",), ("FedDyn",), ("Local",),
        ("FedCAC", "-bt", "1"), ("FedPHP", "-lam", "0.1"), ("APFL",), ("FedAMP", "-alk", "0.1", "-lam", "0.1"),
        ("GPFL",), ("FedDBE",), ("FedROD+LAG",), ("Ditto", "-cdr", "0.3"),
        ("FedLAG", "--lag_signal", "last_batch", "-jr", "0.6"), ("FedPer", "-m", "DNN", "--executor", "batched"))
# Arrays that measure the machine, not the maths.
TIMING = {"rs_round_time"}


def runs(wide: bool = False) -> List[Tuple[str, Tuple[str, ...]]]:
    """(result-file tag, flags) of every run in the set."""
    out = [(f"{algo}_s{seed}", ("-algo", algo, "--seed", str(seed))) for algo in ALGORITHMS for seed in SEEDS]
    if importlib.util.find_spec("ray") is not None:
        out.append(("FedLAG_ray", ("-algo", "FedLAG", "--executor", "ray", "--workers", "2")))
    if wide:
        out += [("_".join(run).replace("-", "").replace(".", ""), ("-algo",) + run) for run in WIDE]
    return out


def run_all(tree: Path, data_dir: Path, results: Path, wide: bool = False) -> Dict[str, Path]:
    files = {}
    for tag, flags in runs(wide):
        out = results / tag
        done = subprocess.run([sys.executable, str(tree / "system" / "main.py"), *COMMON, *flags,
                               "--data_dir", str(data_dir), "--results_dir", str(out)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{tag} failed in {tree}: {done.stderr.strip().splitlines()[-1:]}")
        files[tag] = next(out.glob("*.h5"))
    return files


def arrays_of(path: Path) -> Dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        return {name: f[name][()] for name in f.keys() if name not in TIMING}


def differences(before: Path, after: Path) -> List[str]:
    a, b = arrays_of(before), arrays_of(after)
    found = [f"{name}: only {'before' if name in a else 'after'}" for name in sorted(set(a) ^ set(b))]
    for name in sorted(set(a) & set(b)):
        x, y = a[name], b[name]
        if x.dtype == object or y.dtype == object:  # strings: their bytes are pointers, compare the values
            same = x.shape == y.shape and x.tolist() == y.tolist()
        else:
            same = x.shape == y.shape and x.dtype == y.dtype and x.tobytes() == y.tobytes()
        if not same:
            found.append(f"{name}: differs")
    return found


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--before", default="HEAD", help="commit to compare the working tree with")
    cli.add_argument("--wide", action="store_true", help="also one run of every other exchange path")
    args = cli.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        old_tree = tmp / "before"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(old_tree), args.before],
                       check=True)
        try:
            # One data folder for both sides: the split is built once, by the earlier code.
            before = run_all(old_tree, tmp / "data", tmp / "results-before", args.wide)
            after = run_all(REPO, tmp / "data", tmp / "results-after", args.wide)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old_tree)], check=False)
        failed = 0
        for tag in before:
            found = differences(before[tag], after[tag])
            failed += bool(found)
            print(f"{tag:24s} {'identical' if not found else '; '.join(found)}")
    print(f"{len(before) - failed} of {len(before)} runs identical to {args.before}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
