"""Command-line entry point, PFLlib-compatible::

    python system/main.py -algo FedAvg -data Digits -m CNN -gr 100
    cd system && python main.py -algo FedLAG -data Cifar10 -m ResNet9

Runs ``-pv .. -t-1`` (run ``i`` seeded with ``--seed + i``), writes one ``.h5`` per run under
``results/`` and prints each run's best, final and last-k mean accuracy (``--report_last_k``), then
their mean and std over the runs. With no flag at all it runs the README's quickstart
(:data:`app.options.QUICKSTART`) and says so.
"""
from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

# An entry script: the project's packages are system/ (flcore, utils) and the root (dataset), unless
# installed with ``pip install -e .``. Library modules never touch sys.path.
for _folder in (Path(__file__).resolve().parent, Path(__file__).resolve().parents[1]):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from app.build import build_run, prepare  # noqa: E402
from app.config import RunConfig  # noqa: E402
from app.options import QUICKSTART, parse_args, setup_problems  # noqa: E402
from flcore.lag.mixin import LagError  # noqa: E402
from flcore.registry import lag_base  # noqa: E402
from utils.accuracy_summary import AccuracySummary  # noqa: E402
from utils.errors import ConfigError, UserError  # noqa: E402
from utils.paths import display_path  # noqa: E402
from utils.rounds import rounds_run  # noqa: E402

# Printed as one line, exit status 2. LagError stands beside UserError because flcore/lag/ imports
# only torch (it drops into a PFLlib checkout unchanged).
USER_ERRORS = (UserError, LagError)


def run(config: RunConfig) -> None:
    problems, warnings = setup_problems(config)
    if problems:
        raise ConfigError("; ".join(problems))
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    config, note = prepare(config)
    if note:
        print(f"note: {note}")
    print(f"{config.algorithm} | data {config.dataset} | model {config.model} | {config.num_clients} clients "
          f"x {config.join_ratio} | {rounds_run(config.global_rounds)} | device {config.device} | seed {config.seed}")
    summaries = []
    for i in range(config.prev, config.times):
        print(f"\n=== run {i} (seed {config.seed + i}) ===")
        start = time.perf_counter()
        federated_run = build_run(config, i)
        federated_run.execute()
        s = federated_run.accuracy_summary()
        summaries.append(s)
        print(f"best accuracy {s.best:.4f} | final {s.final:.4f} | {last_k_label(s)} {s.last_k_mean:.4f} | "
              f"{time.perf_counter() - start:.1f} s | results in {display_path(federated_run.results_file)}")
        optional = optional_statistics_line(s)
        if optional:
            print(optional)
    if len(summaries) > 1:
        print(f"\n{over_runs_line(summaries)}")


def optional_statistics_line(summary: AccuracySummary) -> str:
    """The statistics of --val_ratio and --eval_after_training, for the runs made with them."""
    parts = []
    if not np.isnan(summary.test_at_best_val):
        parts.append(f"test accuracy at the best validation round {summary.test_at_best_val:.4f}")
    if not np.isnan(summary.after_final):
        parts.append(f"after local training: best {summary.after_best:.4f} | final {summary.after_final:.4f}")
    return " | ".join(parts)


def last_k_label(summary: AccuracySummary) -> str:
    """``last-10 mean``; the count actually averaged, which is smaller when the run had fewer evaluations."""
    return f"last-{summary.last_k_count} mean"


def over_runs_line(summaries: Sequence[AccuracySummary]) -> str:
    """Mean +- population std over runs of the best, final and last-k mean accuracy (PFLlib's
    ``average_data`` prints the first)."""
    def spread(values) -> str:
        return f"{np.mean(values):.4f} +- {np.std(values):.4f}"

    counts = sorted({s.last_k_count for s in summaries})
    label = f"last-{counts[0]} mean" if len(counts) == 1 else f"last-{summaries[0].last_k} mean"
    return (f"best accuracy over {len(summaries)} runs: {spread([s.best for s in summaries])} | "
            f"final {spread([s.final for s in summaries])} | {label} {spread([s.last_k_mean for s in summaries])}")


def comparison_hint(algorithm: str, argv: list) -> str:
    """After a FedLAG or ``X+LAG`` run: the same command for the base method, to see what LAG changed
    (and, after FedLAG, for Local)."""
    base = "FedAvg" if algorithm == "FedLAG" else lag_base(algorithm)
    if base == algorithm:
        return ""
    words, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word in ("-algo", "--algorithm"):
            skip = True
        elif not word.startswith(("-algo=", "--algorithm=")):
            words.append(shlex.quote(word))
    rest = " ".join(words)
    hint = f"compare with the base method: python system/main.py -algo {base} {rest}".rstrip()
    if algorithm == "FedLAG":  # the two things a personal layer must beat: one shared model, and no sharing
        hint += f"\nand with each client alone: python system/main.py -algo Local {rest}".rstrip()
    return hint


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        argv = list(QUICKSTART)
        print(f"no flags given: running the quickstart, python system/main.py {' '.join(QUICKSTART)}\n"
              "(with any flag, every flag left out has PFLlib's default: -algo FedAvg -gr 2000 ...; --help lists them)")
    config = parse_args(argv)
    try:
        run(config)
        hint = comparison_hint(config.algorithm, argv)
        if hint:
            print(hint)
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
