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
from app.run import RunInterrupted  # noqa: E402
from app.config import RunConfig  # noqa: E402
from app.options import (QUICKSTART, flag_defaults, flag_pieces, parse_args, setup_notes, setup_problems,  # noqa: E402
                         unused_flag_warnings)
from flcore.flag_use import unused_flags  # noqa: E402
from flcore.lag.mixin import LagError  # noqa: E402
from flcore.registry import lag_base  # noqa: E402
from utils.accuracy_summary import AccuracySummary  # noqa: E402
from utils.errors import ConfigError, UserError  # noqa: E402
from utils.paths import display_path  # noqa: E402
from utils.rounds import rounds_run  # noqa: E402

# Printed as one line, exit status 2. LagError stands beside UserError because flcore/lag/ imports
# only torch (it drops into a PFLlib checkout unchanged).
USER_ERRORS = (UserError, LagError)


def run(config: RunConfig, argv: Sequence[str] = ()) -> None:
    """The runs ``config`` asks for; ``argv``, the command it was read from, names the flags given."""
    problems, warnings = setup_problems(config)
    if problems:
        raise ConfigError("; ".join(problems))
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    config, note = prepare(config)  # refuses what the data or the model cannot take, before any note
    # On stdout, with the notes: a flag without effect is what a command shared by several methods carries
    # on purpose (a grid's args:, a FedLAG command rerun as FedAvg), and stderr stays the one line of an error.
    for warning in unused_flag_warnings(config, argv):
        print(f"warning: {warning}")
    for line in [*setup_notes(config, argv), note]:
        if line:
            print(f"note: {line}")
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
        parts = [f"best accuracy {s.best:.4f}", f"final {s.final:.4f}", f"{last_k_label(s)} {s.last_k_mean:.4f}",
                 client_mean_label(s), f"{time.perf_counter() - start:.1f} s",
                 f"results in {display_path(federated_run.results_file)}"]
        print(" | ".join(part for part in parts if part))
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


def client_mean_label(summary: AccuracySummary) -> str:
    """The final accuracy with every client weighted alike, beside PFLlib's weighted by test samples (where
    a few large clients can carry the figure); '' when the run recorded no per-client accuracies."""
    if not summary.clients:
        return ""
    return f"final, mean over {summary.clients} clients {summary.final_client_mean:.4f}"


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
    line = (f"best accuracy over {len(summaries)} runs: {spread([s.best for s in summaries])} | "
            f"final {spread([s.final for s in summaries])} | {label} {spread([s.last_k_mean for s in summaries])}")
    if all(s.clients for s in summaries):
        line += f" | final, mean over clients {spread([s.final_client_mean for s in summaries])}"
    return line


def comparison_hint(algorithm: str, argv: Sequence[str]) -> str:
    """After a FedLAG or ``X+LAG`` run: the same command for the base method, to see what LAG changed
    (and, after FedLAG, for Local)."""
    base = "FedAvg" if algorithm == "FedLAG" else lag_base(algorithm)
    if base == algorithm:
        return ""
    hint = f"compare with the base method: {command_for(base, argv)}"
    if algorithm == "FedLAG":  # the two things a personal layer must beat: one shared model, and no sharing
        hint += f"\nand with each client alone: {command_for('Local', argv)}"
    return hint


def command_for(algorithm: str, argv: Sequence[str]) -> str:
    """``argv`` as a command for ``algorithm``: without the flags it does not read (the ``--lag_*`` flags,
    other methods' hyper-parameters), which would only earn it warnings."""
    dropped = unused_flags(algorithm, flag_defaults()) | {"algorithm"}
    words = [shlex.quote(word) for dest, piece in flag_pieces(argv) if dest not in dropped for word in piece]
    return " ".join(["python system/main.py -algo", algorithm, *words])


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        argv = list(QUICKSTART)
        print(f"no flags given: running the quickstart, python system/main.py {' '.join(QUICKSTART)}\n"
              "(with any flag, every flag left out has PFLlib's default: -algo FedAvg -gr 2000 ...; --help lists them)")
    config = parse_args(argv)
    try:
        run(config, argv)
        hint = comparison_hint(config.algorithm, argv)
        if hint:
            print(hint)
    except RunInterrupted as err:  # the rounds so far are saved; exit as that signal would have ended us
        print(f"error: {err}", file=sys.stderr)
        return err.status
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
