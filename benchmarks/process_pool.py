"""Whole rounds (training and evaluation) in one process against worker processes, on the machine left
alone and beside busy processes: the measurements ``--executor auto``'s choice rests on.

    python benchmarks/process_pool.py                          # every setting and condition; table.md
    python benchmarks/process_pool.py --settings mnist --conditions alone

Settings:

* ``mnist``: the speed comparison with PFLlib - FedAvg, ``dataset/MNIST`` (PFLlib's default split: 20
  clients, Dirichlet 0.1, as ``python dataset/generate_MNIST.py noniid - dir`` writes it), ``-m CNN -gr 2
  -lbs 10 -lr 0.005``;
* ``quickstart``: the README's quickstart (FedLAG, Digits-iid-lg4, 40 clients of 17-67 images), 21 rounds.

Each configuration runs in a fresh process, nothing exported: the default (``--executor auto``, as
printed), one process with one thread and with one thread per core, and one worker process per core.
With ``--pfllib PATH`` (a checkout of upstream PFLlib), the mnist setting also times PFLlib's own
``main.py`` on the same split (written into its ``dataset/MNIST`` from ours when missing), as its users run
it: torch's default thread count, its per-round ``time cost`` lines as seconds per round.

Reported: wall seconds from start to exit, mean seconds per round after round 0 (the ``.h5``'s
``rs_round_time``; round 0 also reads the workers' data), what auto chose, and whether every result array
equals the one-thread run's. "Busy": ``--busy_per_core`` ``python -c "while True: pass"`` per core beside
the measurement, started and stopped by this script. Writes ``table.md`` and ``runs.json`` under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Optional

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "system"), str(REPO)]  # an entry script: the project's packages

from dataset.utils.atomic_io import atomic_path  # noqa: E402
from utils.result_utils import read_results, result_path  # noqa: E402

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
SETTINGS = {
    "mnist": ("-algo", "FedAvg", "-data", "MNIST", "-m", "CNN", "-gr", "2", "-nc", "20", "-lbs", "10",
              "-lr", "0.005"),
    "quickstart": ("-algo", "FedLAG", "-data", "Digits-iid-lg4", "-nc", "40", "-lr", "0.05", "-gr", "20"),
}
CONFIGURATIONS = {  # the first is the base of the speed-ups
    "1 process, 1 thread": ("--executor", "sequential", "--threads", "1"),
    "default (auto)": (),
    f"1 process, {CORES} threads": ("--executor", "sequential", "--threads", str(CORES)),
    f"{CORES} worker processes": ("--executor", "processes", "--workers", str(CORES)),
}
BASE = "1 process, 1 thread"


@contextmanager
def busy(count: int) -> Iterator[None]:
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(1.0 if spinners else 0.0)
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def run(setting: str, name: str, condition: str, out: Path) -> dict:
    goal = f"{condition}-{name.replace(' ', '').replace(',', '-').replace('(', '').replace(')', '')}"
    command = [sys.executable, str(REPO / "system" / "main.py"), *SETTINGS[setting], *CONFIGURATIONS[name],
               "-go", goal, "--results_dir", str(out / setting), "--overwrite"]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    load = os.getloadavg()[0]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{setting} / {name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    chose = next((line for line in done.stdout.splitlines() if line.startswith("clients: ")), "")
    data = SETTINGS[setting][SETTINGS[setting].index("-data") + 1]
    algorithm = SETTINGS[setting][SETTINGS[setting].index("-algo") + 1]
    arrays = read_results(result_path(out / setting, data, algorithm, goal, 0))[0]
    return {"setting": setting, "configuration": name, "condition": condition, "load": load, "wall": wall,
            "per_round": float(np.mean(arrays["rs_round_time"][1:])), "chose": chose,
            "arrays": {k: v.tolist() for k, v in arrays.items() if k != "rs_round_time" and v.dtype != object}}


def pfllib_dataset(checkout: Path) -> None:
    """Our dataset/MNIST in PFLlib's layout (each client's arrays in one pickled ``data`` dict)."""
    for split in ("train", "test"):
        target = checkout / "dataset" / "MNIST" / split
        if target.is_dir() and any(target.iterdir()):
            continue
        target.mkdir(parents=True, exist_ok=True)
        for source in sorted((REPO / "dataset" / "MNIST" / split).glob("*.npz")):
            with np.load(source) as arrays:
                np.savez_compressed(target / source.name, data={"x": arrays["x"], "y": arrays["y"]})


def run_pfllib(checkout: Path, condition: str, timeout: Optional[float] = None) -> dict:
    """PFLlib's own run; stopped after ``timeout`` seconds if given, its seconds per round then from the
    rounds it finished (round 0 alone if only that one; the time so far, as a lower bound, if none)."""
    flags = SETTINGS["mnist"]
    command = [sys.executable, "-u", "main.py", *flags, "-dev", "cpu"]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    load = os.getloadavg()[0]
    start = time.perf_counter()
    stopped = False
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, env=env,
                                   cwd=checkout / "system")
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            stopped = True
        wall = time.perf_counter() - start
        log.seek(0)
        output = log.read()
    if process.returncode and not stopped:
        raise SystemExit(f"PFLlib failed:\n{output[-4000:]}")
    rounds = [float(line.split()[-1]) for line in output.splitlines() if "time cost" in line and
              line.split()[-1].replace(".", "", 1).isdigit()]
    name = "PFLlib (upstream, torch's thread default)"
    if len(rounds) > 1:
        per_round, bound = float(np.mean(rounds[1:])), False
    elif rounds:
        per_round, bound = rounds[0], False
        name += f"; stopped after {wall:.0f} s, round 0 only"
    else:
        per_round, bound = wall, True
        name += f"; stopped after {wall:.0f} s within round 0"
    return {"setting": "mnist", "configuration": name, "condition": condition, "load": load, "wall": wall,
            "per_round": per_round, "lower_bound": bound,
            "chose": "", "arrays": None}


def table(runs: List[dict]) -> List[str]:
    lines = ["| setting | machine | load | configuration | wall s | s/round | speed-up (per round) | "
             "same results | auto chose |", "|---|---|---|---|---|---|---|---|---|"]
    for run_ in runs:
        base = next((r for r in runs if r["setting"] == run_["setting"] and r["condition"] == run_["condition"]
                     and r["configuration"] == BASE), run_)
        chose = run_["chose"].removeprefix("clients: ") if run_["configuration"] == "default (auto)" else ""
        same = "-" if run_["arrays"] is None else ("yes" if run_["arrays"] == base["arrays"] else "no")
        more = ">" if run_.get("lower_bound") else ""  # stopped before its first round ended
        less = "<" if more else ""
        lines.append(f"| {run_['setting']} | {run_['condition']} | {run_['load']:.1f} | {run_['configuration']} | "
                     f"{more}{run_['wall']:.1f} | {more}{run_['per_round']:.2f} | "
                     f"{less}{base['per_round'] / run_['per_round']:.2f}x | {same} | {chose} |")
    return lines


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--settings", nargs="+", choices=tuple(SETTINGS), default=list(SETTINGS))
    cli.add_argument("--conditions", nargs="+", choices=("alone", "busy"), default=["alone", "busy"])
    cli.add_argument("--configurations", nargs="+", choices=tuple(CONFIGURATIONS), default=list(CONFIGURATIONS))
    cli.add_argument("--busy_per_core", type=int, default=2)
    cli.add_argument("--pfllib", type=Path, help="a checkout of upstream PFLlib, timed on the mnist setting")
    cli.add_argument("--pfllib_timeout", type=float, help="seconds after which PFLlib's run is stopped")
    cli.add_argument("--out", type=Path, default=REPO / "results" / "benchmarks" / "parallel")
    opts = cli.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="process_pool_"))
    if opts.pfllib:
        pfllib_dataset(opts.pfllib)
    runs: List[dict] = []
    for condition in opts.conditions:
        with busy(opts.busy_per_core * CORES if condition == "busy" else 0):
            for setting in opts.settings:
                for name in opts.configurations:
                    runs.append(run(setting, name, condition, scratch))
                    print(table(runs)[-1], flush=True)
                if setting == "mnist" and opts.pfllib:
                    runs.append(run_pfllib(opts.pfllib, condition, opts.pfllib_timeout))
                    print(table(runs)[-1], flush=True)
    lines = ["# Whole rounds in one process against worker processes", "",
             f"Command: `{' '.join(['python benchmarks/process_pool.py', *sys.argv[1:]])}`", "",
             f"Machine: {CORES} cores; load: the one-minute load average when the run started (busy: "
             f"{opts.busy_per_core} spinning processes per core started by the benchmark, counted in it).", "",
             *table(runs), ""]
    opts.out.mkdir(parents=True, exist_ok=True)
    with atomic_path(opts.out / "table.md") as tmp:
        Path(tmp).write_text("\n".join(lines), encoding="utf-8")
    with atomic_path(opts.out / "runs.json") as tmp:
        Path(tmp).write_text(json.dumps([{k: v for k, v in r.items() if k != "arrays"} for r in runs], indent=1),
                             encoding="utf-8")
    print(f"table in {opts.out}")


if __name__ == "__main__":
    main()
