"""The paper's Table 1 comparison on the real data, at a size a CPU affords, with its table and plots.

    python benchmarks/paper_comparison.py                       # every algorithm there is; a day on 2 cores
    python benchmarks/paper_comparison.py --preset table1       # the paper's Table 1 rows (+LAG); 4-6 h
    python benchmarks/paper_comparison.py --algorithms "FedAvg FedLAG FedRep FedRep+LAG" --seeds 0-1
    python benchmarks/paper_comparison.py --dry-run             # list the runs, run nothing

What runs: FedAvg, FedLAG and every baseline of the registry whose server exists, each composable one
also as ``X+LAG`` (FedAvg+LAG is left out: FedLAG is exactly that); on MNIST (``--source``
../shared/data/mnist-70k.npz, model DNN as in the authors' scripts) and CIFAR-10 (the 20k subset in
../shared/data, model CNN = PFLlib's FedAvgCNN), Dirichlet alpha 0.1 and 1.0 (the alphas of the
authors' scripts; the paper's table says 0.5), ``--clients`` clients of which ``--join-ratio`` train
each round, local training as in the authors' scripts (SGD, lr 0.005, batch 16, 1 epoch).

How: one grid file per dataset (``<out>/grids/``), each run as ``run_all.sh -g <grid>`` runs it, by the
same :mod:`grid` package, in this process (datasets built offline into dataset/<Base>-dir<alpha>/,
runs already complete are skipped, so the command resumes), then ``system/report.py`` over exactly
the runs those batches planned. ``<out>`` (default results/benchmarks/paper_comparison/) receives the
table and figures, ``runs/`` with the ``.h5`` files and ``runs/logs/``, and COMMAND.md with the exact
command, the commit, the sizes and the wall time.

Every hyper-parameter is main.py's default, each algorithm's own where it has one (its paper's value:
``python system/main.py --help`` lists them), except FedCAC's -bt, set to the run's length
(REQUIRED_ARGS); set others with ``--algo-args``.

Cost (measured per sample on one busy core of the 2-core CPU; a free core is faster): a round of
CIFAR-10/CNN with 20 clients at join ratio 0.5 takes ~7 s (training ~4.5 s, evaluating every client
~2.5 s), of MNIST/DNN ~1.5 s. So one FedAvg-like algorithm x 2 datasets x 2 alphas x 1 seed at 30
rounds is ~9 min of CPU. ``--preset table1`` (18 variants) with 3 seeds: ~8 h of CPU, 4-6 h with
``--jobs 2``; the default (all 58 variants, 3 seeds) ~26 h of CPU. Methods with extra local steps
(PerAvg, Ditto, pFedMe, FedPAC, ...) cost a multiple of FedAvg.

    nice -n 19 python benchmarks/paper_comparison.py --preset table1     # the recommended CPU run
"""
from __future__ import annotations

import argparse
import datetime
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "system"), str(REPO)]  # an entry script: the project's packages

from grid.cli import settings_from_flags  # noqa: E402
from grid.plan import plan_runs  # noqa: E402
from grid.session import run_batch  # noqa: E402
from grid.usage import PROGRAM, UsageError  # noqa: E402
from flcore.registry import ALGORITHMS, LAG_SUFFIX, lag_base, lag_composable  # noqa: E402

DATASETS = {  # name -> (source file, model)
    "MNIST": (REPO.parent / "shared" / "data" / "mnist-70k.npz", "DNN"),
    "Cifar10": (REPO.parent / "shared" / "data" / "cifar10-20k.npz", "CNN"),
}
GOAL = "paper"
# FedCAC's -bt (rounds until its threshold peaks) is set to the run's length; everything else runs with
# main.py's defaults, each algorithm's own (PerAvg -bt 0.001, pFedMe -bt 1, FedPHP -lam 0.1 ...); change
# any with --algo-args.
REQUIRED_ARGS = {
    "FedCAC": "-bt {rounds}",
}
# FedLAG first, then FedAvg; FedAvg+LAG would repeat FedLAG.
CORE = ("FedLAG", "FedAvg")
# The rows of the paper's Table 1 (FedAF has no implementation here).
TABLE1 = ("FedLAG", "FedAvg", "PerAvg", "FedROD", "FedPAC", "FedBABU", "FedCAC", "FedDBE", "GPFL", "FedAS")


def available_algorithms() -> tuple[list[str], list[str]]:
    """(registry names whose server can be imported, [name: why not]) in registry order."""
    from flcore.registry import resolve
    ok, missing = [], []
    for name in ALGORITHMS:
        module = ALGORITHMS[name].server.split(":")[0]
        if not (REPO / "system" / "flcore" / "servers" / f"{module}.py").is_file():
            missing.append(f"{name}: no servers/{module}.py yet")
            continue
        try:
            resolve(name)
        except Exception as err:  # a half-written baseline must not stop the comparison
            missing.append(f"{name}: {type(err).__name__}: {err}")
            continue
        ok.append(name)
    return ok, missing


def default_algorithms(with_lag: bool, only=None) -> tuple[list[str], list[str]]:
    names, missing = available_algorithms()
    if only is not None:
        missing += [f"{n}: not implemented" for n in only if n not in names]
        names = [n for n in names if n in only]
    ordered = [n for n in CORE if n in names] + [n for n in names if n not in CORE]
    out = []
    for name in ordered:
        out.append(name)
        if with_lag and name != "FedAvg" and lag_composable(ALGORITHMS[name]):
            out.append(name + LAG_SUFFIX)
    return out, missing


def alpha_token(alpha: str) -> str:
    """0.1 -> '0.1', 1 -> '1.0': the folder names of the brief (MNIST-dir0.1, Cifar10-dir1.0)."""
    text = f"{float(alpha):g}"
    return text if "." in text or "e" in text else f"{text}.0"


def model_of(args, dataset: str) -> str:
    return args.mnist_model if dataset == "MNIST" else args.cifar_model


def seconds(text: float) -> str:
    return str(datetime.timedelta(seconds=int(text)))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--algorithms", default=None,
                   help="space/comma separated; default: FedAvg, FedLAG and every baseline that exists, "
                        "with X+LAG")
    p.add_argument("--preset", choices=("all", "table1"), default="all",
                   help="default list: every algorithm there is, or the paper's Table 1 rows that exist")
    p.add_argument("--no-lag", action="store_true", help="leave out the X+LAG variants of the default list")
    p.add_argument("--datasets", default="MNIST Cifar10", help=f"any of {', '.join(DATASETS)}")
    p.add_argument("--alphas", default="0.1 1.0", help="Dirichlet concentrations")
    p.add_argument("--seeds", default="0-2", help="run indices (seeds), e.g. '0 1' or 0-4")
    p.add_argument("--rounds", type=int, default=30, help="-gr")
    p.add_argument("--clients", type=int, default=20, help="-nc and the datasets' client count")
    p.add_argument("--join-ratio", type=float, default=0.5, help="-jr")
    p.add_argument("--batch-size", type=int, default=16, help="-lbs (authors' scripts: 16)")
    p.add_argument("--lr", type=float, default=0.005, help="-lr (authors' default)")
    p.add_argument("--local-epochs", type=int, default=1, help="-ls")
    p.add_argument("--eval-gap", type=int, default=1, help="-eg")
    p.add_argument("--mnist-model", default=DATASETS["MNIST"][1])
    p.add_argument("--cifar-model", default=DATASETS["Cifar10"][1])
    p.add_argument("--extra", default="", help="more main.py flags for every run, e.g. '--lag_top_k 3'")
    p.add_argument("--algo-args", action="append", default=[], metavar="ALGO=FLAGS",
                   help="flags for one algorithm and its +LAG, e.g. 'FedProx=-mu 0.01' (repeatable; "
                        "replaces the built-in flags of that algorithm)")
    p.add_argument("--jobs", type=int, default=2, help="runs at once (run_all.sh -j)")
    p.add_argument("--timeout", type=int, default=0, help="seconds per run before it counts as failed (0: none)")
    p.add_argument("--device", default="cpu", help="-dev of every run")
    p.add_argument("--data_dir", type=Path, default=REPO / "dataset", help="where the datasets are built")
    p.add_argument("--out", type=Path, default=REPO / "results" / "benchmarks" / "paper_comparison")
    p.add_argument("--dry-run", action="store_true", help="write the grids and list the runs only")
    return p


def write_grid(path: Path, args, dataset: str, algorithms: list[str]) -> None:
    source, _ = DATASETS[dataset]
    model = model_of(args, dataset)
    alphas = " ".join(f"dir{alpha_token(a)}" for a in args.alphas.replace(",", " ").split())
    extra = f" {args.extra}" if args.extra else ""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"# Written by benchmarks/paper_comparison.py; the paper's Table 1 setting at CPU size.\n"
        f"algorithms: {' '.join(algorithms)}\n"
        f"datasets:   {dataset}\n"
        f"partitions: {alphas}\n"
        f"models:     {model}\n"
        f"seeds:      {args.seeds}\n"
        f"rounds:     {args.rounds}\n"
        f"clients:    {args.clients}\n"
        f"join_ratio: {args.join_ratio}\n"
        f"goal:       {GOAL}\n"
        f"device:     {args.device}\n"
        f"source:     {dataset}={os.path.relpath(source, REPO)}\n"
        f"args:       -lbs {args.batch_size} -lr {args.lr} -ls {args.local_epochs} -eg {args.eval_gap}{extra}\n"
        + "".join(f"args.{name}: {flags}\n" for name, flags in algorithm_flags(args).items()
                  if name in {lag_base(a) for a in algorithms}))



def algorithm_flags(args) -> dict:
    """Per-algorithm flags: the built-in REQUIRED_ARGS, replaced by any --algo-args."""
    flags = {name: text.format(rounds=args.rounds) for name, text in REQUIRED_ARGS.items()}
    for item in args.algo_args:
        name, sep, text = item.partition("=")
        if not sep:
            raise SystemExit(f"error: --algo-args expects ALGO=FLAGS, got {item!r}")
        flags[name.strip()] = text.strip()
    return flags


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    datasets = args.datasets.replace(",", " ").split()
    unknown = [d for d in datasets if d not in DATASETS]
    if unknown:
        print(f"error: unknown dataset(s) {unknown}; choose from {list(DATASETS)}", file=sys.stderr)
        return 2
    for d in datasets:
        if not DATASETS[d][0].is_file():
            print(f"error: {DATASETS[d][0]} not found (the real data of ../shared/data)", file=sys.stderr)
            return 2
    if args.algorithms:
        algorithms, missing = args.algorithms.replace(",", " ").split(), []
    else:
        algorithms, missing = default_algorithms(not args.no_lag, TABLE1 if args.preset == "table1" else None)
    for line in missing:
        print(f"note: left out {line}")
    print(f"{len(algorithms)} algorithms: {' '.join(algorithms)}")

    out = args.out.resolve()
    runs = out / "runs"
    command = "python benchmarks/paper_comparison.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    start = time.time()
    failed = False
    summaries = []
    files = []  # exactly this command's runs: runs/ may hold files of earlier commands (other algorithms or sizes)
    for dataset in datasets:
        grid = out / "grids" / f"{dataset}.grid"
        write_grid(grid, args, dataset, algorithms)
        flags = ["-g", str(grid), "-j", str(args.jobs), "--data_dir", str(args.data_dir.resolve()),
                 "--results_dir", str(runs)]
        if args.timeout:
            flags += ["--timeout", str(args.timeout)]
        if args.dry_run:
            flags.append("--dry-run")
        # The command that runs the same batch by hand; here the grid package runs it in this process.
        print(f"\n$ {shlex.join(['bash', str(REPO / 'run_all.sh'), *flags])}", flush=True)
        try:
            settings = settings_from_flags(flags)
            plan = plan_runs(settings)
            outcome = run_batch(settings, plan)
        except UsageError as err:
            print(f"{PROGRAM}: {err}", file=sys.stderr)
            failed = True
            continue
        files += [Path(run.result_file) for run in plan.runs]
        summaries += [f"{dataset}: {line}" for line in outcome.summary_lines]
        failed |= outcome.exit_code != 0
        if outcome.interrupted:  # Ctrl-C stops the whole comparison, not only this dataset's batch
            return outcome.exit_code
    if args.dry_run:
        return 0
    for old in [*out.glob("curves*.png"), *out.glob("heatmap_*.png"), *out.glob("personal_*.png")]:
        old.unlink()  # figures of an earlier command that this one may not redraw
    report = [sys.executable, str(REPO / "system" / "report.py"), *[str(f) for f in files if f.is_file()],
              "-o", str(out), "--title", "Paper-style comparison (Table 1 layout) on MNIST and CIFAR-10"]
    print(f"\n$ python system/report.py <{sum(f.is_file() for f in files)} of the {len(files)} runs' .h5 "
          f"in {runs}> -o {out}", flush=True)
    made = subprocess.run(report, cwd=REPO).returncode == 0
    elapsed = time.time() - start
    from utils.result_utils import read_results
    compute = sum(float(read_results(f)[0].get("rs_round_time", [0]).sum()) for f in files if f.is_file())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip() or "?"
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout
    bases = {lag_base(a) for a in algorithms}
    per_algorithm = "; ".join(f"{k} {v}" for k, v in algorithm_flags(args).items() if k in bases)
    (out / "COMMAND.md").write_text(
        "# How these results were made\n\n"
        f"```bash\n{command.strip()}\n```\n\n"
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}; commit {commit}"
        f"{' (with uncommitted changes)' if dirty.strip() else ''}; wall time of this invocation "
        f"{seconds(elapsed)} (runs already complete are skipped); training time recorded in the "
        f"{sum(f.is_file() for f in files)} runs (sum of per-round times): {seconds(compute)}\n"
        f"- datasets: {', '.join(datasets)}; Dirichlet alpha {args.alphas}; {args.clients} clients, join ratio "
        f"{args.join_ratio}; {args.rounds} rounds; seeds {args.seeds}\n"
        f"- local training: -lbs {args.batch_size} -lr {args.lr} -ls {args.local_epochs}; eval every "
        f"{args.eval_gap} round(s); models: MNIST {args.mnist_model}, CIFAR-10 {args.cifar_model}"
        f"{'; extra flags: ' + args.extra if args.extra else ''}\n"
        f"- per-algorithm flags: {per_algorithm or 'none'}\n"
        f"- grids: `grids/*.grid` (each run through `run_all.sh -g <grid>`); runs and logs: `runs/`\n\n"
        "run_all.sh summaries:\n\n```\n" + "\n".join(summaries) + "\n```\n")
    print(f"\nwall time {seconds(elapsed)}; table and figures in {out}")
    return 1 if failed or not made else 0


if __name__ == "__main__":
    sys.exit(main())
