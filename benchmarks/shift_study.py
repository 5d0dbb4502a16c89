"""FedLAG under four kinds of shift, beside the layer-split and clustered baselines: best, final and worst
single-round drop, which layers each FedLAG rule chose, and how well group sharing and clustered FL find
the true client groups.

    python benchmarks/shift_study.py                                  # the committed study
    python benchmarks/shift_study.py --datasets MNIST --shifts concept --jr 1 --seeds 1 --jobs 2 \\
        --methods FedPer "FedLAG groups"

Setting: 20 clients, ``-m CNN`` (``CNN-BN`` for FedBN), batch 10, one local epoch, ``--lr`` (0.05) and
``--rounds`` (30), on a seeded sample of ``--images`` images of MNIST and of the CIFAR-10 subset
(``../shared/data``), built offline with the project's generators. The shifts (client i in group i % 4
wherever there are groups):

* ``label`` skew: Dirichlet(0.1) labels, no groups;
* ``concept`` shift: IID labels, each group names the classes through its own permutation (``-lg4``);
* ``rotation``: IID labels, group g's images turned by g x 90 degrees (``-rot4``);
* ``corruption`` (CIFAR-10 only): IID labels, group g's images corrupted (none, Gaussian noise, blur,
  contrast; ``-cor4``).

Per run: best, final and the largest fall between two consecutive evaluations after round 5. For the
FedLAG rules, the layers kept personal (each layer with the share of runs in which it was personal at
the end); for group sharing, IFCA and CFL, the adjusted Rand index of the final groups against the true
ones. Runs are skipped when their complete ``.h5`` exists, so an interrupted study resumes. Writes
``table.md`` next to the runs (``--out``), with every cell that has runs there, whichever this call ran.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from fedlag_stability import DROP_AFTER, cell, run_stats
from run_jobs import run_jobs

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "system"), str(REPO)]  # an entry script: the project's packages

from utils.result_utils import read_results, result_path  # noqa: E402

SHARED = REPO.parent / "shared" / "data"
SOURCES = {"MNIST": ("generate_MNIST.py", SHARED / "mnist-70k.npz"),
           "Cifar10": ("generate_Cifar10.py", SHARED / "cifar10-20k.npz")}
GROUPS = 4
# shift -> (folder partition word, generator flags, datasets it applies to)
SHIFTS: Dict[str, Tuple[str, Tuple[str, ...], Tuple[str, ...]]] = {
    "label": ("dir0.1", ("noniid", "-", "dir", "--alpha", "0.1"), ("MNIST", "Cifar10")),
    "concept": ("iid-lg4", ("iid", "-", "-", "--label-groups", str(GROUPS)), ("MNIST", "Cifar10")),
    "rotation": ("iid-rot4", ("iid", "-", "-", "--feature-groups", str(GROUPS)), ("MNIST", "Cifar10")),
    "corruption": ("iid-cor4", ("iid", "-", "-", "--feature-groups", str(GROUPS), "--feature-shift", "corruption"),
                   ("Cifar10",)),
}
# label -> (-algo, extra flags, result tag)
METHODS: Dict[str, Tuple[str, Tuple[str, ...], str]] = {
    "FedAvg": ("FedAvg", (), "base"),
    "Local": ("Local", (), "base"),
    "FedPer": ("FedPer", (), "base"),
    "FedRep": ("FedRep", (), "base"),
    "LG-FedAvg": ("LG-FedAvg", (), "base"),
    "FedBN (CNN-BN)": ("FedBN", ("-m", "CNN-BN"), "bn"),
    "IFCA": ("IFCA", (), "base"),
    "IFCA shared base": ("IFCA", ("--ifca_share_base",), "sharebase"),
    "CFL": ("CFL", (), "base"),
    "FedLAG default": ("FedLAG", (), "default"),
    "FedLAG random K": ("FedLAG", ("--lag_schedule", "random"), "random"),
    "FedLAG groups": ("FedLAG", ("--lag_share", "groups"), "groups"),
    "FedLAG check": ("FedLAG", ("--lag_share", "check", "--val_ratio", "0.1"), "check"),
}


def folder_of(dataset: str, shift: str, images: int) -> str:
    return f"{dataset}{images // 1000}k-{SHIFTS[shift][0]}"


def sampled_source(dataset: str, images: int, data_dir: Path) -> Path:
    """A seeded sample of ``images`` of the dataset's source file (all of them for 0), written once."""
    _, source = SOURCES[dataset]
    if not images:
        return source
    path = data_dir / "_sources" / f"{dataset}-{images}.npz"
    if not path.is_file():
        with np.load(source) as f:
            x, y = f["x"], f["y"]
        pick = np.sort(np.random.default_rng(0).choice(len(y), size=images, replace=False))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, x=x[pick], y=y[pick])
        tmp.rename(path)
    return path


def ensure_dataset(dataset: str, shift: str, images: int, data_dir: Path) -> str:
    folder = folder_of(dataset, shift, images)
    if not (data_dir / folder / "config.json").is_file():
        script, _ = SOURCES[dataset]
        subprocess.run([sys.executable, str(REPO / "dataset" / script), *SHIFTS[shift][1], "--num-clients", "20",
                        "--source", str(sampled_source(dataset, images, data_dir)), "--name", folder,
                        "--root", str(data_dir)], check=True, stdout=subprocess.DEVNULL)
    return folder


def goal_of(label: str, jr: float) -> str:
    return f"jr{jr:g}-{METHODS[label][2]}".replace(".", "p")


def run_one(job) -> str:
    folder, label, jr, seed, opts = job
    algorithm, flags, _ = METHODS[label]
    path = result_path(opts.out, folder, algorithm, goal_of(label, jr), seed)
    if complete_run(path) is not None:
        return f"kept {path.name}"
    cmd = [sys.executable, str(REPO / "system" / "main.py"), "-data", folder, "-m", "CNN", "-algo", algorithm,
           "-gr", str(opts.rounds), "-jr", str(jr), "-lr", str(opts.lr), "-go", goal_of(label, jr), "-dev", "cpu",
           "--threads", "1", "--seed", "0", "-pv", str(seed), "-t", str(seed + 1), "--data_dir", str(opts.data_dir),
           "--results_dir", str(opts.out), *flags]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return f"FAILED {' '.join(cmd[1:])}: {done.stderr.strip().splitlines()[-1:]}"
    return f"ran {path.name}"


def adjusted_rand(groups: np.ndarray) -> float:
    from sklearn.metrics import adjusted_rand_score
    return float(adjusted_rand_score(np.arange(len(groups)) % GROUPS, groups))


def final_groups(arrays: dict) -> Optional[np.ndarray]:
    """Each client's final group: group sharing's for its (first) personal layer, or IFCA's / CFL's cluster."""
    if "lag_groups" in arrays and len(arrays["lag_groups"]):
        personal = np.asarray(arrays["lag_personal"][-1], dtype=bool)
        if personal.any():
            return np.asarray(arrays["lag_groups"][-1][int(np.argmax(personal))])
    if "cluster_of_client" in arrays and len(arrays["cluster_of_client"]):
        return np.asarray(arrays["cluster_of_client"][-1])
    return None


def personal_layers(runs: List[dict]) -> str:
    """The layers personal at the end, with the share of runs (``head 3/3``)."""
    counts: Counter = Counter()
    for arrays in runs:
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in arrays["lag_layer_names"]]
        personal = np.asarray(arrays["lag_personal"][-1], dtype=bool) if len(arrays["lag_personal"]) else []
        counts.update(name for name, kept in zip(names, personal) if kept)
    return ", ".join(f"{name} {n}/{len(runs)}" for name, n in counts.most_common()) or "none"


def copies_taken(runs: List[dict]) -> str:
    """``--lag_share check``: the share of (client, personal layer) pairs on each copy at the end."""
    taken = np.concatenate([np.asarray(a["lag_copies"][-1]).ravel() for a in runs if len(a["lag_copies"])])
    taken = taken[taken >= 0]
    if not taken.size:
        return ""
    shares = np.bincount(taken, minlength=3) / taken.size
    return "; copies " + " / ".join(f"{name} {100 * v:.0f}%" for name, v in zip(("own", "group", "all"), shares))


def complete_run(path: Path) -> Optional[dict]:
    """The arrays of the run at ``path`` if it finished, else None (absent or interrupted)."""
    if not path.is_file():
        return None
    arrays, attrs = read_results(path)
    return arrays if attrs.get("complete") else None


def study_cells(opts) -> List[Tuple[str, str, float]]:
    """Every cell of the study, whatever this invocation ran: a study made in parts (one dataset or rate at a
    time) still gets one whole table."""
    rates = sorted(set(opts.jr) | {1.0, 0.2}, reverse=True)
    return [(shift, folder_of(d, shift, opts.images), jr)
            for d in SOURCES for shift in SHIFTS if d in SHIFTS[shift][2] for jr in rates]


def table(opts) -> str:
    """One section per cell with complete runs in ``--out``, one row per method with runs."""
    lines = []
    for shift, folder, jr in study_cells(opts):
        rows = []
        for label, (algorithm, _, _) in METHODS.items():
            runs = [arrays for seed in range(opts.seeds)
                    for arrays in [complete_run(result_path(opts.out, folder, algorithm, goal_of(label, jr), seed))]
                    if arrays is not None]
            if not runs:
                continue
            n = len(runs)
            best, final, drop = (list(v) for v in zip(*(run_stats(a["rs_test_acc"]) for a in runs)))
            layers = personal_layers(runs) if "lag_personal" in runs[0] else ""
            layers += copies_taken(runs) if "lag_copies" in runs[0] else ""
            found = [final_groups(a) for a in runs]
            ari = (cell([adjusted_rand(g) for g in found if g is not None], n)
                   if shift != "label" and any(g is not None for g in found) else "")
            seeds = f" ({n} seed{'s' if n > 1 else ''})" if n != opts.seeds else ""
            rows.append(f"| {label}{seeds} | {cell(best, n)} | {cell(final, n)} | {cell(drop, n)} | {layers} | {ari} |")
        if rows:
            lines += [f"### {shift}: `{folder}`, `-jr {jr:g}`", "",
                      "| method | best | final | worst drop | personal layers | adjusted Rand index |",
                      "|---|---|---|---|---|---|", *rows, ""]
    return "\n".join(lines)


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--datasets", nargs="+", default=list(SOURCES), choices=list(SOURCES))
    cli.add_argument("--shifts", nargs="+", default=list(SHIFTS), choices=list(SHIFTS))
    cli.add_argument("--jr", nargs="+", type=float, default=[1.0, 0.2])
    cli.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS), metavar="METHOD")
    cli.add_argument("--seeds", type=int, default=3)
    cli.add_argument("--rounds", type=int, default=30)
    cli.add_argument("--lr", type=float, default=0.05)
    cli.add_argument("--images", type=int, default=6000, help="a seeded sample of each source (0: all)")
    cli.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 1)))
    cli.add_argument("--data_dir", type=Path, default=REPO / "dataset")
    cli.add_argument("--out", type=Path, default=REPO / "results" / "benchmarks" / "shift")
    cli.add_argument("--table_only", action="store_true", help="only rebuild the table from the runs")
    opts = cli.parse_args()
    opts.out.mkdir(parents=True, exist_ok=True)
    if not opts.table_only:
        cells = [(shift, ensure_dataset(d, shift, opts.images, opts.data_dir), jr) for d in opts.datasets
                 for shift in opts.shifts if d in SHIFTS[shift][2] for jr in sorted(opts.jr, reverse=True)]
        # Seeds outermost and cheap cells first, so a budget that runs out leaves whole seeds.
        jobs = [(folder, label, jr, seed, opts) for seed in range(opts.seeds)
                for shift, folder, jr in sorted(cells, key=lambda c: c[2]) for label in opts.methods]
        run_jobs(run_one, jobs, opts.jobs)
    text = table(opts)
    (opts.out / "table.md").write_text(
        f"{opts.rounds + 1} evaluations (rounds 0..{opts.rounds}), `-lr {opts.lr:g}`, 20 clients, "
        f"{opts.images or 'all'} images; accuracy in %, mean ± std over {opts.seeds} seeds; drop = largest fall "
        f"between two consecutive rounds after round {DROP_AFTER}.\n\n{text}\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
