"""What an upload reveals: Deep Leakage from Gradients (``-dlg``) against FedAvg, FedPer, FedLAG (each
client's own layers, and shared within groups) and Ditto+LAG, on MNIST and CIFAR-10.

    python benchmarks/dlg_leakage.py --mnist-source MNIST.npz --cifar10-source CIFAR10.npz
    python benchmarks/dlg_leakage.py --table_only          # table.md from the runs present

Setting, chosen so that the attack has its best chance (the case DLG was made for): a seeded sample of
``--images`` images of each source file (the project's ``x``/``y`` ``.npz`` of uint8 pixels), split by the
project's generator into 10 clients holding one class each (``pat``, one class per client); ``-fs 1`` keeps
one training image per client, so a selected client trains one SGD step on one image (``-ls 1``) and its
upload is the start minus ``-lr`` times that image's gradient. ``-m CNN``, ``-lr 0.05``, ``-jr 0.4`` (4 of
the 10 clients a round), rounds 0..2, each attacked (``-dlgg 1 -bnpc 1``): 12 attacked uploads per run.
In round 0 no method has a personal layer yet beyond its own (FedPer's head); FedLAG chooses its first
at the end of round 0, so rounds 1-2 show what keeping it changes. Runs are skipped when their complete
``.h5`` exists. Writes ``table.md`` next to the runs (``--out``).
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

from run_jobs import run_jobs  # noqa: E402
from utils.result_utils import read_results, result_path  # noqa: E402

GENERATORS = {"MNIST": "generate_MNIST.py", "Cifar10": "generate_Cifar10.py"}
CLIENTS = 10
# label -> (-algo, extra flags, result goal, what the client keeps from the attacker)
METHODS: Dict[str, Tuple[str, Tuple[str, ...], str, str]] = {
    "FedAvg": ("FedAvg", (), "dlg", "nothing: every tensor is sent and uploaded"),
    "FedPer": ("FedPer", (), "dlg", "the head: never uploaded"),
    "FedLAG": ("FedLAG", (), "dlg", "its personal layers: uploaded (scored), never sent, so no start is known"),
    "FedLAG groups": ("FedLAG", ("--lag_share", "groups"), "dlg-groups",
                      "its personal layers: uploaded, sent as its group's model"),
    "FedLAG sketch": ("FedLAG", ("--lag_upload", "sketch"), "dlg-sketch",
                      "its personal layers: kept, a 64-number sketch of each one's update uploaded"),
    "Ditto+LAG": ("Ditto+LAG", (), "dlg", "its personal layers (of the global model it uploads)"),
}
FLAGS = ("-m", "CNN", "-nc", str(CLIENTS), "-jr", "0.4", "-gr", "2", "-ls", "1", "-lbs", "1", "-fs", "1",
         "-lr", "0.05", "-dlg", "-dlgg", "1", "-bnpc", "1", "-dev", "cpu", "--threads", "1", "--seed", "0")


def folder_of(dataset: str, images: int) -> str:
    return f"{dataset}{images // 1000}k-pat1-nc{CLIENTS}"


def sampled_source(source: Path, dataset: str, images: int, data_dir: Path) -> Path:
    """A seeded sample of ``images`` of ``source`` (written once under ``data_dir/_sources``)."""
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


def ensure_dataset(dataset: str, source: Optional[Path], images: int, data_dir: Path) -> str:
    folder = folder_of(dataset, images)
    if not (data_dir / folder / "config.json").is_file():
        if source is None:
            sys.exit(f"{folder} is not built under {data_dir}: give --{dataset.lower()}-source FILE")
        subprocess.run([sys.executable, str(REPO / "dataset" / GENERATORS[dataset]), "noniid", "-", "pat",
                        "--class-per-client", "1", "--num-clients", str(CLIENTS),
                        "--source", str(sampled_source(source, dataset, images, data_dir)), "--name", folder,
                        "--root", str(data_dir)], check=True, stdout=subprocess.DEVNULL)
    return folder


def run_one(job) -> str:
    folder, label, opts = job
    algorithm, flags, goal, _ = METHODS[label]
    path = result_path(opts.out, folder, algorithm, goal, 0)
    if complete_run(path) is not None:
        return f"kept {path.name}"
    cmd = [sys.executable, str(REPO / "system" / "main.py"), "-data", folder, "-algo", algorithm, "-go", goal,
           *FLAGS, "--data_dir", str(opts.data_dir), "--results_dir", str(opts.out), *flags]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return f"FAILED {' '.join(cmd[1:])}: {done.stderr.strip().splitlines()[-1:]}"
    return f"ran {path.name}"


def complete_run(path: Path) -> Optional[dict]:
    """The arrays of the run at ``path`` if it finished, else None (absent or interrupted)."""
    if not path.is_file():
        return None
    arrays, attrs = read_results(path)
    return arrays if attrs.get("complete") else None


def personal_names(arrays: dict) -> str:
    """The layers an X+LAG run kept personal in the rounds after the first (``lag_personal``), by name."""
    if "lag_personal" not in arrays or not len(arrays["lag_personal"]):
        return ""
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in arrays["lag_layer_names"]]
    kept = np.asarray(arrays["lag_personal"][:-1], dtype=bool).any(axis=0)  # chosen after rounds 0..1
    return ", ".join(name for name, k in zip(names, kept) if k) or "none"


def row(label: str, arrays: dict) -> str:
    psnr, ssim = np.asarray(arrays["rs_dlg_psnr"]), np.asarray(arrays["rs_dlg_ssim"])
    tensors, seen = np.asarray(arrays["rs_dlg_tensors"]), np.asarray(arrays["rs_dlg_seen"])
    kept = personal_names(arrays)
    keeps = METHODS[label][3] + (f" ({kept})" if kept else "")
    counts = ", ".join(f"{t:g}" for t in tensors)
    return (f"| {label} | {psnr.mean():.2f} | {psnr[0]:.2f} | {psnr[1:].mean():.2f} | {ssim.mean():.3f} | "
            f"{counts} | {100 * seen[1:].mean():.1f}% | {keeps} |")


def random_start_row(folder: str, data_dir: Path) -> str:
    """What the measures give when nothing is learnt: each attack's random start (drawn as the runs draw it,
    ``--seed 0``, for every client and rounds 0-2) scored against the client's image, as the runs score."""
    import torch
    from flcore.privacy.leakage import attack_generator, first_batches, score
    from utils.client_data import load_client_data
    from utils.datasets import dataset_info
    info = dataset_info(folder, CLIENTS, data_dir)
    psnr, ssim = [], []
    for client in range(CLIENTS):
        data = load_client_data(info, client, "train", torch.device("cpu"), num_classes=info.num_classes, few_shot=1)
        real = first_batches(data, 1, 1)[0]
        for rnd in range(3):
            measured = score(torch.randn(real.shape, generator=attack_generator(0, client, rnd, 0)), real)
            psnr.append(float(measured.psnr.mean()))
            ssim.append(float(measured.ssim.mean()))
    return (f"| the attack's random start (nothing learnt) | {np.mean(psnr):.2f} | | | {np.mean(ssim):.3f} | | | "
            f"30 draws: every client, rounds 0-2 |")


def table(opts) -> str:
    lines = []
    for dataset in GENERATORS:
        folder = folder_of(dataset, opts.images)
        rows = [row(label, arrays) for label, (algorithm, _, goal, _) in METHODS.items()
                for arrays in [complete_run(result_path(opts.out, folder, algorithm, goal, 0))] if arrays is not None]
        if rows and (opts.data_dir / folder / "config.json").is_file():
            rows.append(random_start_row(folder, opts.data_dir))
        if rows:
            lines += [f"### {dataset} (`{folder}`)", "",
                      "| method | PSNR (dB), rounds 0-2 | round 0 | rounds 1-2 | SSIM | parameter tensors matched, "
                      "per round | share of parameter values matched, rounds 1-2 | what the client keeps from the "
                      "attacker |", "|---|---|---|---|---|---|---|---|", *rows, ""]
    return "\n".join(lines)


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--mnist-source", type=Path, help="the MNIST source file (.npz of uint8 x, y)")
    cli.add_argument("--cifar10-source", type=Path, help="the CIFAR-10 source file (.npz of uint8 x, y)")
    cli.add_argument("--images", type=int, default=2000, help="a seeded sample of each source")
    cli.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS), metavar="METHOD")
    cli.add_argument("--jobs", type=int, default=2)
    cli.add_argument("--data_dir", type=Path, default=REPO / "dataset")
    cli.add_argument("--out", type=Path, default=REPO / "results" / "benchmarks" / "dlg")
    cli.add_argument("--table_only", action="store_true", help="only rebuild the table from the runs")
    opts = cli.parse_args()
    opts.out.mkdir(parents=True, exist_ok=True)
    if not opts.table_only:
        sources = {"MNIST": opts.mnist_source, "Cifar10": opts.cifar10_source}
        folders = [ensure_dataset(d, sources[d], opts.images, opts.data_dir) for d in GENERATORS]
        jobs: List[tuple] = [(folder, label, opts) for folder in folders for label in opts.methods]
        run_jobs(run_one, jobs, opts.jobs)
    text = table(opts)
    (opts.out / "table.md").write_text(
        f"DLG's reconstructions of the one training image of each attacked client (4 a round, rounds 0-2: 12 "
        f"per run, one seed), PSNR and SSIM on [0, 1] pixels (higher: more revealed); "
        f"`python benchmarks/dlg_leakage.py`, setting in its docstring.\n\n{text}\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
