"""Thousands of clients on one machine: peak resident memory and seconds per round against the client count.

    python benchmarks/scale.py                                   # the committed table
    python benchmarks/scale.py --clients 100 1000 --models CNN --methods FedAvg Ditto
    python benchmarks/scale.py --checks_only                     # the two checks again, beside the saved runs
    OTHER_ENV/bin/python benchmarks/scale.py --checks_only       # ... with another torch build, kept beside

Each configuration runs in a process of its own (its peak resident memory, ``VmHWM``, is its own):
``-nc`` clients of one 10,000-client MNIST split (Dirichlet 100 over the labels, about 5 train and 2 test
images per client, built once from ``--source`` with the project's generator), so every client count
holds the same clients' data and the slope between two counts is what one more client costs. About
``--per_round`` clients train per round (``-jr per_round / clients``), ``--rounds`` rounds after round 0,
evaluation at the first and last round on a fixed sample of 20 clients (``--eval_clients 20``), one thread.

Reported per run: peak resident memory, resident memory once the clients are built, seconds per round
(median of the rounds without evaluation), what the clients own at the end (personal tensors, control
variates, ...) and the client-state files written (``--state_memory``). Also: the bytes each extra client
adds (the slope between the two largest counts) against what it owns plus its data, and two named
checks: Ditto with ResNet18 at 200 clients under ``--state_memory 2G``, and the size of a checkpoint of
FedLAG / CNN at 1,000 clients. Each run records its torch build; the checks are kept per build, since the
build alone moves the peak (a CUDA build's libraries take about 0.4 GB more resident memory than the
CPU-only build's, used or not). Writes ``table.md`` and ``runs.json`` under ``--out``.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]
SPLIT = "MNIST-dir100-10000"
METHODS = ("FedAvg", "FedLAG", "FedRep", "Ditto", "SCAFFOLD")
MODELS = ("CNN", "ResNet18")

CHILD = r"""
import json, sys, time
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from pathlib import Path

def resident(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

from app.build import build_server, prepare
from app.options import parse_args
from app.run import FederatedRun
config, _ = prepare(parse_args(sys.argv[4:]))
server = build_server(config)
built = resident("VmRSS")
run = FederatedRun(server)
run.execute()
checkpoint = None
if sys.argv[3] == "checkpoint":
    checkpoint = run.save_checkpoint(config.global_rounds).stat().st_size
store = server.state_store
own = sum(store.owned_bytes(c.id) for c in server.clients if not store.is_spilled(c.id))
spilled = sum(store.owned_bytes(c.id) for c in server.clients if store.is_spilled(c.id))
data = sum(int(d.x.numel() * d.x.element_size() + d.y.numel() * d.y.element_size())
           for c in server.clients for d in (c.train_data, c.test_data))
import torch
print(json.dumps({"torch": torch.__version__, "peak": resident("VmHWM"), "built": built, "round_times": server.history["rs_round_time"],
                  "own_in_memory": own, "own_in_files": spilled, "data": data,
                  "files_written": store.files.written, "files_read": store.files.read_back,
                  "checkpoint": checkpoint, "final_accuracy": server.rs_test_acc[-1]}))
"""


def ensure_split(data_dir: Path, source: Path) -> None:
    if (data_dir / SPLIT / "config.json").is_file():
        return
    subprocess.run([sys.executable, str(REPO / "dataset" / "generate_MNIST.py"), "noniid", "-", "dir", "--alpha", "100",
                    "--min-samples", "3", "--num-clients", "10000", "--source", str(source), "--name", SPLIT,
                    "--root", str(data_dir)], check=True, stdout=subprocess.DEVNULL)


def run_one(opts, method: str, model: str, clients: int, *extra: str, mode: str = "") -> dict:
    join = min(1.0, opts.per_round / clients)
    flags = ["-data", SPLIT, "--data_dir", str(opts.data_dir), "-m", model, "-algo", method, "-nc", str(clients),
             "-jr", f"{join:g}", "-gr", str(opts.rounds), "-eg", str(opts.rounds), "--eval_clients", "20",
             "-dev", "cpu", "--threads", "1", "-go", "scale", *extra]
    with tempfile.TemporaryDirectory() as results:
        done = subprocess.run([sys.executable, "-c", CHILD, str(REPO / "system"), str(REPO), mode or "-", *flags,
                               "--results_dir", results], capture_output=True, text=True)
    if done.returncode != 0:
        return {"method": method, "model": model, "clients": clients, "extra": list(extra),
                "failed": (done.stderr.strip().splitlines() or ["?"])[-1]}
    found = json.loads(done.stdout.strip().splitlines()[-1])
    timed = [t for i, t in enumerate(found.pop("round_times")) if 0 < i < opts.rounds] or [float("nan")]
    return {"method": method, "model": model, "clients": clients, "extra": list(extra),
            "s_per_round": statistics.median(timed), **found}


def gb(count) -> str:
    return "" if count is None else f"{count / 1e9:.2f}"


def kb(count) -> str:
    return f"{count / 1e3:.1f}"


def table(runs: List[dict], with_torch: bool = False) -> str:
    lines = ["| " + "torch | " * with_torch + "model | method | clients | peak GB | built GB | s/round | "
             "owned in memory MB | owned in files MB | files written / read |",
             "|---" * (9 + with_torch) + "|"]
    for r in runs:
        build = f"| {r.get('torch', '?')} " if with_torch else ""
        if "failed" in r:
            lines.append(f"{build}| {r['model']} | {r['method']} {' '.join(r['extra'])} | {r['clients']} | failed: "
                         f"{r['failed']} | | | | | |")
            continue
        lines.append(f"{build}| {r['model']} | {r['method']} {' '.join(r['extra'])} | {r['clients']:,} | {gb(r['peak'])} | "
                     f"{gb(r['built'])} | {r['s_per_round']:.2f} | {r['own_in_memory'] / 1e6:.1f} | "
                     f"{r['own_in_files'] / 1e6:.1f} | {r['files_written']} / {r['files_read']} |")
    return "\n".join(lines)


def slopes(runs: List[dict]) -> str:
    """Bytes per extra client between the two largest counts of each model and method."""
    lines = ["| model | method | clients | peak added per client KB | owned + data per client KB | excess KB |",
             "|---|---|---|---|---|---|"]
    plain = [r for r in runs if not r["extra"] and "failed" not in r]
    for model in dict.fromkeys(r["model"] for r in plain):
        for method in dict.fromkeys(r["method"] for r in plain):
            found = sorted((r for r in plain if r["model"] == model and r["method"] == method),
                           key=lambda r: r["clients"])
            if len(found) < 2:
                continue
            a, b = found[-2], found[-1]
            added = (b["peak"] - a["peak"]) / (b["clients"] - a["clients"])
            own = ((b["own_in_memory"] + b["data"]) - (a["own_in_memory"] + a["data"])) / (b["clients"] - a["clients"])
            lines.append(f"| {model} | {method} | {a['clients']:,} to {b['clients']:,} | {kb(added)} | {kb(own)} | "
                         f"{kb(added - own)} |")
    return "\n".join(lines)


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--clients", nargs="+", type=int, default=[100, 1000, 10000])
    cli.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    cli.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    cli.add_argument("--rounds", type=int, default=3)
    cli.add_argument("--per_round", type=int, default=10)
    cli.add_argument("--checks", action=argparse.BooleanOptionalAction, default=True,
                     help="also the Ditto --state_memory run and the checkpoint size")
    cli.add_argument("--checks_only", action="store_true",
                     help="run only the checks again, keeping the runs saved in --out's runs.json")
    cli.add_argument("--data_dir", type=Path, default=REPO / "dataset")
    cli.add_argument("--source", type=Path, default=REPO.parent / "shared" / "data" / "mnist-70k.npz",
                     help="MNIST as one .npz of x and y (the generator's --source)")
    cli.add_argument("--out", type=Path, default=REPO / "results" / "benchmarks" / "scale")
    opts = cli.parse_args()
    ensure_split(opts.data_dir, opts.source)
    opts.out.mkdir(parents=True, exist_ok=True)
    saved = opts.out / "runs.json"
    runs: List[dict] = []
    if opts.checks_only:  # the saved runs stay; only the checks are made again
        runs = json.loads(saved.read_text(encoding="utf-8"))["runs"]
    else:
        for model, method, clients in itertools.product(opts.models, opts.methods, opts.clients):
            runs.append(run_one(opts, method, model, clients))
            print(json.dumps(runs[-1]), flush=True)
    checks: Dict[str, dict] = {}
    if opts.checks_only:  # checks made with another torch build stay beside this one's
        checks = {name: check for name, check in json.loads(saved.read_text(encoding="utf-8")).get("checks", {}).items()
                  if "torch" in check}
    if opts.checks or opts.checks_only:
        build = __import__("torch").__version__
        checks[f"ditto {build}"] = run_one(opts, "Ditto", "ResNet18", 200, "--state_memory", "2G")
        checks[f"checkpoint {build}"] = run_one(opts, "FedLAG", "CNN", 1000, mode="checkpoint")
        print(json.dumps(checks), flush=True)
    saved.write_text(json.dumps({"runs": runs, "checks": checks}, indent=1) + "\n", encoding="utf-8")
    runs_build = next((r["torch"] for r in runs if "torch" in r), __import__("torch").__version__)
    text = [f"torch {runs_build}, CPU, one thread; `-nc N` of `{SPLIT}`, about "
            f"{opts.per_round} clients trained per round, {opts.rounds} rounds after round 0.", "",
            table(runs), "", "Memory one more client adds (between the two largest counts):", "", slopes(runs)]
    if checks:
        text += ["", "Checks (torch build of each in its row):", "", table(list(checks.values()), with_torch=True)]
        for name, check in checks.items():
            if name.startswith("checkpoint") and check.get("checkpoint"):
                text += ["", f"Checkpoint of FedLAG / CNN at 1,000 clients ({check.get('torch', '?')}): "
                             f"{check['checkpoint'] / 1e6:.1f} MB."]
    (opts.out / "table.md").write_text("\n".join(text) + "\n", encoding="utf-8")
    print("\n".join(text))


if __name__ == "__main__":
    main()
