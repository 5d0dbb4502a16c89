"""Command-line flags: PFLlib's names, short forms and defaults, plus the project's own.

Differences from PFLlib, on purpose:
* boolean flags accept ``True/False/1/0/yes/no`` (PFLlib's ``type=bool`` turns ``False`` into True),
  and may be given bare (``-ab``) to mean true;
* ``-data`` defaults to ``Digits``, the embedded dataset, so the first command needs no download;
* ``-ncl`` defaults to the dataset's own class count (config.json), not 10;
* ``--seed`` seeds everything; run ``i`` of ``-t`` uses ``seed + i``.
"""
from __future__ import annotations

import argparse
import math
from typing import List, Optional, Sequence

from flcore.lag.conflict import GRANULARITIES as LAG_GRANULARITIES
from flcore.lag.mixin import SCHEDULES as LAG_SCHEDULES
from flcore.lag.mixin import SIGNALS as LAG_SIGNALS


def str2bool(value: str) -> bool:
    lowered = str(value).strip().lower()
    if lowered in ("1", "true", "t", "yes", "y", "on"):
        return True
    if lowered in ("0", "false", "f", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (True/False, 1/0, yes/no), got {value!r}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Personalised federated learning benchmark (PFLlib-compatible command line).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)

    def flag(short: str, long: str, **kw) -> None:
        p.add_argument(short, long, **kw)

    def boolean(short: str, long: str, help: str) -> None:
        p.add_argument(short, long, type=str2bool, nargs="?", const=True, default=False, help=help)

    # General (PFLlib section 1.2).
    flag("-go", "--goal", default="test", help="tag in the result file name")
    flag("-dev", "--device", default="cuda", help="cpu, cuda or cuda:N; cuda falls back to cpu")
    flag("-did", "--device_id", default="0", help="GPU index used with -dev cuda")
    flag("-data", "--dataset", default="Digits", help="folder under dataset/")
    flag("-ncl", "--num_classes", type=int, default=None, help="classes (default: the dataset's)")
    flag("-m", "--model", default="CNN", help="model family")
    flag("-lbs", "--batch_size", type=int, default=10)
    flag("-lr", "--local_learning_rate", type=float, default=0.005)
    boolean("-ld", "--learning_rate_decay", "exponential lr decay, one step per local training")
    flag("-ldg", "--learning_rate_decay_gamma", type=float, default=0.99)
    flag("-gr", "--global_rounds", type=int, default=2000, help="rounds 0..gr are run")
    flag("-tc", "--top_cnt", type=int, default=100, help="patience of -ab")
    flag("-ls", "--local_epochs", type=int, default=1)
    flag("-algo", "--algorithm", default="FedAvg", help="algorithm, or X+LAG")
    flag("-jr", "--join_ratio", type=float, default=1.0, help="fraction of clients per round, in (0, 1]")
    boolean("-rjr", "--random_join_ratio", "draw each round's count in [jr*nc, nc]")
    flag("-nc", "--num_clients", type=int, default=20)
    flag("-pv", "--prev", type=int, default=0, help="first run index")
    flag("-t", "--times", type=int, default=1, help="runs prev..times-1")
    flag("-eg", "--eval_gap", type=int, default=1, help="evaluate every eg rounds")
    boolean("-ab", "--auto_break", "stop when the best accuracy is -tc evaluations old")
    flag("-nnc", "--num_new_clients", type=int, default=0, help="clients nc..nc+nnc-1 held out")
    flag("-ften", "--fine_tuning_epoch_new", type=int, default=0, help="new-client fine-tuning epochs")
    flag("-fs", "--few_shot", type=int, default=0, help="keep k train samples per label (0 = all)")
    flag("-cdr", "--client_drop_rate", type=float, default=0.0,
         help="fraction of trained clients whose update is dropped")
    p.add_argument("--seed", type=int, default=0, help="seeds Python, NumPy, torch and client sampling")
    p.add_argument("--data_dir", default=None, help="folder holding <dataset>/ (default: dataset/)")
    p.add_argument("--results_dir", default=None, help="folder for .h5 results (default: results/)")
    p.add_argument("--checkpoint_every", type=int, default=0,
                   help="write a checkpoint every N rounds under <results>/checkpoints/ (0 = never)")
    boolean("-rs", "--resume", "continue from the newest checkpoint of the same run (same flags)")
    p.add_argument("--executor", default="sequential", choices=("sequential", "ray"),
                   help="how selected clients train: one after another, or in parallel on Ray workers")
    p.add_argument("--ray_address", default="", help="'' starts a local Ray; 'auto' or host:port joins a cluster")
    p.add_argument("--workers", type=int, default=2, help="Ray workers (actors)")
    p.add_argument("--gpus_per_worker", type=float, default=0.0, help="GPUs reserved per Ray worker")

    # Algorithm hyper-parameters (PFLlib's names; their meaning depends on the algorithm).
    flag("-bt", "--beta", type=float, default=0.0)
    flag("-lam", "--lamda", type=float, default=1.0)
    flag("-mu", "--mu", type=float, default=0.0)
    flag("-K", "--K", type=int, default=5, help="pFedMe inner steps")
    flag("-lrp", "--p_learning_rate", type=float, default=0.01, help="pFedMe personal lr")
    flag("-M", "--M", type=int, default=5, help="FedFomo models sent per client")
    flag("-alk", "--alphaK", type=float, default=1.0, help="FedAMP")
    flag("-sg", "--sigma", type=float, default=1.0, help="FedAMP kernel width")
    flag("-al", "--alpha", type=float, default=1.0)
    flag("-pls", "--plocal_epochs", type=int, default=1, help="Ditto personal / FedRep head epochs")
    flag("-tau", "--tau", type=float, default=1.0)
    flag("-fte", "--fine_tuning_epochs", type=int, default=10, help="FedBABU final fine-tuning")
    flag("-slr", "--server_learning_rate", type=float, default=1.0)
    flag("-et", "--eta", type=float, default=1.0, help="FedALA")
    flag("-s", "--rand_percent", type=int, default=80, help="FedALA")
    flag("-p", "--layer_idx", type=int, default=2, help="FedALA")
    flag("-mo", "--momentum", type=float, default=0.1, help="FedDBE")
    flag("-klw", "--kl_weight", type=float, default=0.0, help="FedDBE")

    # FedLAG (../shared/docs FEDLAG.md section A).
    p.add_argument("--lag_top_k", type=int, default=2, help="personalised layers K (0 = base method)")
    p.add_argument("--lag_xi", type=float, default=0.0, help="cosine threshold xi in [-1, 0]")
    p.add_argument("--lag_schedule", default="every_round", choices=LAG_SCHEDULES)
    p.add_argument("--lag_warmup", type=int, default=None,
                   help="warm-up rounds W (default min(gr // 2, 30)); warmup schedule only")
    p.add_argument("--lag_granularity", default="tensor", choices=LAG_GRANULARITIES)
    p.add_argument("--lag_signal", default="delta", choices=LAG_SIGNALS)
    return p


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    problems = validate(args)
    if problems:
        parser.error("; ".join(problems))
    return args


def validate(args: argparse.Namespace) -> List[str]:
    """Range checks that need no data; each problem names the flag and the accepted range."""
    problems = []

    def need(ok: bool, message: str) -> None:
        if not ok:
            problems.append(message)

    need(0 < args.join_ratio <= 1, f"-jr/--join_ratio must be in (0, 1], got {args.join_ratio}")
    need(args.global_rounds >= 0, f"-gr/--global_rounds must be >= 0, got {args.global_rounds}")
    need(args.num_clients >= 1, f"-nc/--num_clients must be >= 1, got {args.num_clients}")
    need(args.batch_size >= 1, f"-lbs/--batch_size must be >= 1, got {args.batch_size}")
    need(args.local_epochs >= 0, f"-ls/--local_epochs must be >= 0, got {args.local_epochs}")
    need(args.eval_gap >= 1, f"-eg/--eval_gap must be >= 1, got {args.eval_gap}")
    need(math.isfinite(args.local_learning_rate) and args.local_learning_rate > 0,
         f"-lr/--local_learning_rate must be a positive number, got {args.local_learning_rate}")
    need(0 <= args.client_drop_rate < 1,
         f"-cdr/--client_drop_rate must be in [0, 1), got {args.client_drop_rate}")
    need(0 <= args.prev < args.times, f"-pv/--prev must be in [0, -t), got {args.prev} with -t {args.times}")
    need(args.num_new_clients >= 0, f"-nnc must be >= 0, got {args.num_new_clients}")
    need(args.few_shot >= 0, f"-fs/--few_shot must be >= 0, got {args.few_shot}")
    need(args.num_classes is None or args.num_classes >= 2, f"-ncl must be >= 2, got {args.num_classes}")
    need(args.workers >= 1, f"--workers must be >= 1, got {args.workers}")
    need(args.gpus_per_worker >= 0, f"--gpus_per_worker must be >= 0, got {args.gpus_per_worker}")
    need(args.checkpoint_every >= 0, f"--checkpoint_every must be >= 0, got {args.checkpoint_every}")
    need(args.lag_top_k >= 0, f"--lag_top_k must be >= 0, got {args.lag_top_k}")
    need(-1 <= args.lag_xi <= 0, f"--lag_xi must be in [-1, 0], got {args.lag_xi}")
    need(args.lag_warmup is None or args.lag_warmup >= 0, f"--lag_warmup must be >= 0, got {args.lag_warmup}")
    return problems
