"""Command-line entry point, PFLlib-compatible::

    python system/main.py -algo FedAvg -data Digits -m CNN -gr 100
    cd system && python main.py -algo FedLAG -data Cifar10 -m ResNet9

Runs ``-pv .. -t-1`` (run ``i`` seeded with ``--seed + i``), writes one ``.h5`` per run under
``results/`` and prints the mean and std of the best accuracy over the runs.
"""
from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

# An entry script: the project's packages are system/ (flcore, utils) and the root (dataset), unless
# installed with ``pip install -e .``. Library modules never touch sys.path.
for _folder in (Path(__file__).resolve().parent, Path(__file__).resolve().parents[1]):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from flcore.lag.mixin import LagError  # noqa: E402
from flcore.registry import lag_base  # noqa: E402
from flcore.runner import build_server, prepare  # noqa: E402
from flcore.servers.serverbase import ConfigError  # noqa: E402
from utils.errors import UserError  # noqa: E402
from utils.options import parse_args, setup_problems  # noqa: E402
from utils.paths import display_path  # noqa: E402
from utils.result_utils import average_data  # noqa: E402

# Printed as one line, exit status 2. LagError stands beside UserError because flcore/lag/ imports
# only torch (it drops into a PFLlib checkout unchanged).
USER_ERRORS = (UserError, LagError)


def run(args) -> None:
    problems, warnings = setup_problems(args)
    if problems:
        raise ConfigError("; ".join(problems))
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    args, note = prepare(args)
    if note:
        print(f"note: {note}")
    print(f"{args.algorithm} | data {args.dataset} | model {args.model} | {args.num_clients} clients "
          f"x {args.join_ratio} | {args.global_rounds} rounds | device {args.device} | seed {args.seed}")
    for i in range(args.prev, args.times):
        print(f"\n=== run {i} (seed {args.seed + i}) ===")
        start = time.perf_counter()
        server = build_server(args, i)
        server.train()
        best = max(server.rs_test_acc) if server.rs_test_acc else float("nan")
        print(f"best accuracy {best:.4f} | {time.perf_counter() - start:.1f} s | "
              f"results in {display_path(server.results_file())}")
    if args.times - args.prev > 1:
        folder = server.results_file().parent
        mean, std = average_data(folder, args.dataset, args.algorithm, args.goal, list(range(args.prev, args.times)))
        print(f"\nbest accuracy over {args.times - args.prev} runs: {mean:.4f} +- {std:.4f}")


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
    args = parse_args(argv)
    try:
        run(args)
        hint = comparison_hint(args.algorithm, argv)
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
