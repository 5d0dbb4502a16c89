"""Command-line flags: PFLlib's names, short forms and defaults, plus the project's own.

Differences from PFLlib, on purpose:
* boolean flags accept ``True/False/1/0/yes/no`` (PFLlib's ``type=bool`` turns ``False`` into True),
  and may be given bare (``-ab``) to mean true;
* ``-data`` defaults to ``Digits``, the embedded dataset, so the first command needs no download;
* ``-ncl`` defaults to the dataset's own class count (config.json), not 10, and ``-vs`` to a text
  dataset's vocabulary size, not 80;
* ``--seed`` seeds everything; run ``i`` of ``-t`` uses ``seed + i``.
"""
from __future__ import annotations

import argparse
import math
import textwrap
from typing import List, Optional, Sequence, Tuple

from flcore.lag.selector import add_lag_arguments, lag_flag_problems
from flcore.registry import algorithms_by_group, unknown_name_message
from flcore.trainmodel.models import IMAGE_MODELS, MODELS, SENSOR_MODELS, TEXT_MODELS, VECTOR_MODELS, UnknownModelError
from utils.accuracy_summary import DEFAULT_LAST_K
from utils.paths import DATASET_DIR


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Adds ``(default: X)`` to every help line, except where the default is None or empty: those flags
    say in their own words what happens when they are left out (e.g. "the dataset's class count")."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.default == "":
            return action.help or ""
        return super()._get_help_string(action)

    def _split_lines(self, text: str, width: int) -> List[str]:
        # Never break inside a name such as LG-FedAvg or a value such as bit-identical.
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def dataset_generators() -> List[str]:
    """Names of the datasets a ``dataset/generate_<Name>.py`` script can build."""
    return sorted((p.stem[len("generate_"):] for p in DATASET_DIR.glob("generate_*.py")), key=str.lower)


def models_by_input() -> str:
    """The ``-m`` names grouped by the input they take, on one line."""
    groups = (("images", IMAGE_MODELS), ("sensor windows", SENSOR_MODELS), ("feature vectors", VECTOR_MODELS),
              ("text, with -vs and -ml", TEXT_MODELS))
    return "; ".join(f"{kind}: {', '.join(models)}" for kind, models in groups)


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
        formatter_class=HelpFormatter)

    def flag(short: str, long: str, **kw) -> None:
        p.add_argument(short, long, **kw)

    def boolean(short: str, long: str, help: str) -> None:
        p.add_argument(short, long, type=str2bool, nargs="?", const=True, default=False, help=help)

    # General (PFLlib section 1.2).
    flag("-go", "--goal", default="test", help="tag in the result file name")
    flag("-dev", "--device", default="cuda", help="cpu, cuda or cuda:N; cuda falls back to cpu")
    flag("-did", "--device_id", default="0", help="GPU index used with -dev cuda")
    flag("-data", "--dataset", default="Digits",
         help="dataset folder under --data_dir: Digits (embedded, built on first use) or one made by "
              f"dataset/generate_<Name>.py ({', '.join(n for n in dataset_generators() if n != 'Digits')}; "
              "offline: --source FILE, see the generator's --help)")
    flag("-ncl", "--num_classes", type=int, default=None,
         help="number of classes (default: the dataset's, from its config.json)")
    flag("-m", "--model", default="CNN", help=f"model; {models_by_input()}")
    flag("-vs", "--vocab_size", type=int, default=None,
         help="text models' vocabulary size: token ids 0..vs-1, 0 is padding (default: the dataset's, from "
              "its config.json; PFLlib passes 80 for Shakespeare, 32000 for AG_News and SogouNews)")
    flag("-ml", "--max_len", type=int, default=200,
         help="text models' longest token sequence, at least the dataset's (it sizes the Transformer's "
              "position table)")
    flag("-lbs", "--batch_size", type=int, default=10, help="local minibatch size")
    flag("-lr", "--local_learning_rate", type=float, default=0.005, help="clients' SGD learning rate")
    boolean("-ld", "--learning_rate_decay", "exponential lr decay, one step per local training")
    flag("-ldg", "--learning_rate_decay_gamma", type=float, default=0.99, help="decay factor of -ld")
    flag("-gr", "--global_rounds", type=int, default=2000, help="rounds 0..gr are run")
    flag("-tc", "--top_cnt", type=int, default=100, help="patience of -ab")
    flag("-ls", "--local_epochs", type=int, default=1, help="local epochs per round")
    flag("-algo", "--algorithm", default="FedAvg", help=f"algorithm; {algorithms_by_group()}")
    flag("-jr", "--join_ratio", type=float, default=1.0, help="fraction of clients per round, in (0, 1]")
    boolean("-rjr", "--random_join_ratio", "draw each round's count in [jr*nc, nc]")
    flag("-nc", "--num_clients", type=int, default=20,
         help="clients taking part (the dataset must hold at least -nc plus -nnc)")
    flag("-pv", "--prev", type=int, default=0, help="first run index")
    flag("-t", "--times", type=int, default=1, help="runs prev..times-1")
    flag("-eg", "--eval_gap", type=int, default=1, help="evaluate every eg rounds")
    p.add_argument("--report_last_k", type=int, default=DEFAULT_LAST_K,
                   help="also report the mean accuracy of the last K evaluations (in the .h5's summary and the "
                        "end-of-run line). K counts evaluations, not rounds: with -eg 5 the last 10 evaluations "
                        "span 50 rounds; a run with fewer evaluations averages all of them. Changes what is "
                        "reported, never what is trained")
    p.add_argument("--val_ratio", type=float, default=0.0,
                   help="hold out this fraction of each client's train data (the same samples for every seed) "
                        "as a validation set, evaluated with the test set; reports then also give the test "
                        "accuracy at the evaluation with the best validation accuracy, so the round is not "
                        "chosen on the test set (0 = none)")
    p.add_argument("--eval_after_training", action="store_true",
                   help="also evaluate the round's trained clients after local training (rs_after_* in the "
                        ".h5), beside PFLlib's evaluation after the broadcast")
    p.add_argument("--tensorboard", action="store_true",
                   help="write TensorBoard event files under <results>/tensorboard/<run>/ (needs the "
                        "tensorboard package)")
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
    p.add_argument("--executor", default="sequential", choices=("sequential", "ray", "batched"),
                   help="how selected clients train: one after another, in parallel on Ray workers, or batched: "
                        "together, one vmapped step for all (plain-SGD algorithms; equal to sequential up to "
                        "float rounding)")
    p.add_argument("--batch_clients", type=int, default=0,
                   help="--executor batched: clients trained together per group (0 = all of the round's)")
    p.add_argument("--ray_address", default="", help="Ray cluster to join: 'auto' or host:port (default: empty, which starts a local Ray)")
    p.add_argument("--workers", type=int, default=2, help="Ray workers (actors)")
    p.add_argument("--gpus_per_worker", type=float, default=0.0, help="GPUs reserved per Ray worker")
    p.add_argument("--ray_timeout", type=float, default=600.0,
                   help="seconds to wait for the next client back from the Ray workers before the run stops "
                        "(results so far kept); 0 waits forever")
    p.add_argument("--threads", type=int, default=0,
                   help="torch intra-op threads (0 = torch's default: OMP_NUM_THREADS, else the cores); "
                        "results are bit-identical only for the same count")

    # Algorithm hyper-parameters (PFLlib's names; their meaning depends on the algorithm).
    flag("-bt", "--beta", type=float, default=0.0,
         help="pFedMe server mixing, PerAvg second step size, FedNTD loss weight, FedCAC")
    flag("-lam", "--lamda", type=float, default=1.0,
         help="regularisation weight: pFedMe, FedAMP, FedProto, FD, GPFL, FedCP, FedPAC, FedPHP")
    flag("-mu", "--mu", type=float, default=0.0,
         help="proximal or contrastive weight: FedProx, Ditto, MOON, GPFL, FedPHP")
    flag("-K", "--K", type=int, default=5, help="pFedMe inner steps")
    flag("-lrp", "--p_learning_rate", type=float, default=0.01, help="pFedMe personal lr")
    flag("-M", "--M", type=int, default=5, help="FedFomo models sent per client")
    flag("-alk", "--alphaK", type=float, default=1.0, help="FedAMP")
    flag("-sg", "--sigma", type=float, default=1.0, help="FedAMP kernel width")
    flag("-al", "--alpha", type=float, default=1.0, help="APFL mixing weight; FedDyn regulariser")
    flag("-pls", "--plocal_epochs", type=int, default=1, help="Ditto personal / FedRep head epochs")
    flag("-tau", "--tau", type=float, default=1.0, help="MOON, FedNTD, FedLC temperature; FedCAC")
    flag("-fte", "--fine_tuning_epochs", type=int, default=10, help="FedBABU final fine-tuning")
    flag("-slr", "--server_learning_rate", type=float, default=1.0, help="server step size: SCAFFOLD, FedGH")
    flag("-et", "--eta", type=float, default=1.0, help="FedALA")
    flag("-s", "--rand_percent", type=int, default=80, help="FedALA")
    flag("-p", "--layer_idx", type=int, default=2, help="FedALA")
    flag("-mo", "--momentum", type=float, default=0.1, help="FedDBE")
    flag("-klw", "--kl_weight", type=float, default=0.0, help="FedDBE")

    # FedLAG (../shared/docs FEDLAG.md section A).
    add_lag_arguments(p)
    return p


def check_model_name(name: str) -> None:
    """Refuse an unknown ``-m`` before any data is read, with the closest valid name."""
    if name not in MODELS:
        raise UnknownModelError(unknown_name_message("model", name, MODELS, where_listed=f" (-m: {', '.join(MODELS)})"))


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
    need(args.report_last_k >= 1, f"--report_last_k must be >= 1 (evaluations to average), got {args.report_last_k}")
    need(math.isfinite(args.local_learning_rate) and args.local_learning_rate > 0,
         f"-lr/--local_learning_rate must be a positive number, got {args.local_learning_rate}")
    need(0 <= args.client_drop_rate < 1,
         f"-cdr/--client_drop_rate must be in [0, 1), got {args.client_drop_rate}")
    need(0 <= args.prev < args.times, f"-pv/--prev must be in [0, -t), got {args.prev} with -t {args.times}")
    need(args.num_new_clients >= 0, f"-nnc must be >= 0, got {args.num_new_clients}")
    need(args.few_shot >= 0, f"-fs/--few_shot must be >= 0, got {args.few_shot}")
    need(0 <= args.val_ratio < 1, f"--val_ratio must be in [0, 1), got {args.val_ratio}")
    need(args.num_classes is None or args.num_classes >= 2, f"-ncl must be >= 2, got {args.num_classes}")
    need(args.workers >= 1, f"--workers must be >= 1, got {args.workers}")
    need(args.gpus_per_worker >= 0, f"--gpus_per_worker must be >= 0, got {args.gpus_per_worker}")
    need(args.ray_timeout >= 0, f"--ray_timeout must be >= 0 seconds (0 = no limit), got {args.ray_timeout}")
    need(args.batch_clients >= 0, f"--batch_clients must be >= 0 (0 = all of a round's clients), got {args.batch_clients}")
    need(args.threads >= 0, f"--threads must be >= 0 (0 = torch's default), got {args.threads}")
    need(args.vocab_size is None or args.vocab_size >= 2,
         f"-vs/--vocab_size must be >= 2 (the padding id 0 and a token), got {args.vocab_size}")
    need(args.max_len >= 1, f"-ml/--max_len must be >= 1, got {args.max_len}")
    need(args.checkpoint_every >= 0, f"--checkpoint_every must be >= 0, got {args.checkpoint_every}")
    problems += lag_flag_problems(args)
    problems += value_problems(args, problems)
    return problems


def _flag_labels() -> tuple:
    """``{dest: "-short/--long"}`` for every flag, and the set of float-valued dests."""
    labels, floats = {}, set()
    for action in build_parser()._actions:
        if action.option_strings:
            labels[action.dest] = "/".join(action.option_strings)
            if action.type is float:
                floats.add(action.dest)
    return labels, floats


def value_problems(args: argparse.Namespace, reported: Sequence[str] = ()) -> List[str]:
    """Values no run can use, beyond the ranges checked above (``reported`` problems are not repeated):
    NaN or infinite numbers in any float flag (they surface much later as a diverged loss blamed on
    -lr), and with -ld a decay factor that is not positive."""
    labels, floats = _flag_labels()
    problems = []
    for dest in sorted(floats):
        value = getattr(args, dest, None)
        label = labels[dest]
        if isinstance(value, float) and not math.isfinite(value) \
                and not any(p.startswith((label + " ", label.split("/")[-1] + " ")) for p in reported):
            problems.append(f"{label} must be a finite number, got {value}")
    gamma = args.learning_rate_decay_gamma
    if args.learning_rate_decay and math.isfinite(gamma) and gamma <= 0:
        problems.append(f"-ldg/--learning_rate_decay_gamma must be > 0 with -ld (each local training multiplies "
                        f"the learning rate by it), got {gamma}")
    return problems


def ray_installed() -> bool:
    """Whether ``import ray`` works (Ray is an optional extra: requirements-distributed.txt)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def setup_problems(args: argparse.Namespace) -> Tuple[List[str], List[str]]:
    """(problems, warnings) of flag combinations that parse but make a run pointless or odd.

    ``main.py`` checks them before any data is read; :func:`parse_args` does not, so that tests may
    still build such servers on purpose (e.g. a round without uploads).
    """
    problems, warnings = [], []
    if args.executor == "ray" and not ray_installed():
        problems.append("--executor ray needs Ray, which is not installed: pip install -r "
                        "requirements-distributed.txt (or run with --executor sequential)")
    if args.executor == "batched":
        from flcore.batched.support import batched_problem
        problem = batched_problem(args.algorithm, args.model)
        if problem:
            problems.append(problem)
    if not (0 < args.join_ratio <= 1 and 0 <= args.client_drop_rate < 1 and args.num_clients >= 1):
        return problems, warnings  # already refused by validate()
    # The same arithmetic as Server.__init__ and Server.receive_models.
    per_round = max(1, int(args.num_clients * args.join_ratio))
    most = args.num_clients if args.random_join_ratio else per_round
    if args.client_drop_rate > 0:
        if int((1 - args.client_drop_rate) * most) == 0:
            problems.append(
                f"-cdr/--client_drop_rate {args.client_drop_rate} drops every update: of the {most} client(s) "
                f"trained per round int((1 - {args.client_drop_rate}) * {most}) = 0 are aggregated, so the "
                f"model never changes; lower -cdr to at most {1 - 1 / most:.4g} or raise -jr/-nc")
        elif int((1 - args.client_drop_rate) * per_round) == 0:
            warnings.append(f"-cdr/--client_drop_rate {args.client_drop_rate}: rounds that draw {per_round} "
                            f"client(s) (-jr {args.join_ratio} with -rjr) aggregate no update")
    if args.local_epochs == 0:
        warnings.append("-ls/--local_epochs 0: clients run no local epochs, so only an algorithm's own extra "
                        "steps (e.g. FedRep's -pls head epochs) change any model")
    gamma = args.learning_rate_decay_gamma
    if args.learning_rate_decay and math.isfinite(gamma) and gamma > 1:
        warnings.append(f"-ldg/--learning_rate_decay_gamma {gamma} > 1 with -ld: the learning rate grows with "
                        f"every local training")
    return problems, warnings
