"""``RunConfig``: a run's flags as one frozen, typed object, and the one declaration of the common flags.

Every field declares its flag (PFLlib's short and long names, default, help, allowed values;
``utils/flagfields.py``): ``app/options.py`` makes the command line from these declarations and
refuses what they refuse, with the flag named. Two groups sit inside: PFLlib's shared hyper-parameter
flags (:class:`~flcore.algorithm_flags.AlgorithmFlags`: ``-mu``, ``-lam`` ..., which the chosen
algorithm reads through its own dataclass) and FedLAG's (:class:`~flcore.lag.settings.LagSettings`).

:meth:`RunConfig.flags` is the run's record, ``{dest: value}`` for every flag in command-line order: the
``config`` attribute of the ``.h5``, the checkpoints' key and what ``--resume`` compares.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass
from typing import Dict, List, Optional

from app.memory import AUTO_SHARE, FLOOR_MODELS
from flcore.algorithm_flags import AlgorithmFlags
from flcore.lag.settings import LagSettings
from flcore.registry import hyperparameters_of
from utils.accuracy_summary import DEFAULT_LAST_K
from utils.flagfields import field_problems, flag, flag_values, nested, read_namespace
from utils.paths import DATASET_DIR
from utils.seeding import MAX_SEED
from utils.sizes import size_flag

EXECUTORS = ("auto", "sequential", "processes", "ray", "batched")


def memory_budget(text: str) -> str:
    """``--state_memory``'s type: a size or ``auto`` (:func:`~utils.sizes.size_flag`), with a negative budget
    (``-5G``) named as such rather than as "not a size"."""
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"{text!r} is a negative memory budget; give a positive size, e.g. 512M, "
                                         f"2G or 1.5GiB, or auto")
    return size_flag(text)


# The lists in these help texts are computed when --help is built (the model zoo imports torch).
def _dataset_help() -> str:
    generators = sorted((p.stem[len("generate_"):] for p in DATASET_DIR.glob("generate_*.py")), key=str.lower)
    return ("dataset folder under --data_dir: Digits (embedded, built on first use) or one made by "
            f"dataset/generate_<Name>.py ({', '.join(n for n in generators if n != 'Digits')}; "
            "offline: --source FILE, see the generator's --help)")


def _model_help() -> str:
    from flcore.trainmodel.models import IMAGE_MODELS, SENSOR_MODELS, TEXT_MODELS, VECTOR_MODELS
    groups = (("images", IMAGE_MODELS), ("sensor windows", SENSOR_MODELS), ("feature vectors", VECTOR_MODELS),
              ("text, with -vs and -ml", TEXT_MODELS))
    return "model; " + "; ".join(f"{kind}: {', '.join(models)}" for kind, models in groups)


def _algorithm_help() -> str:
    from flcore.registry import algorithms_by_group
    return f"algorithm; {algorithms_by_group()}"


@dataclass(frozen=True)
class RunConfig:
    """The flags of one run, in PFLlib's command-line order (``-go`` first, ``--threads`` last)."""
    # General (PFLlib section 1.2).
    goal: str = flag("-go", "--goal", default="test", run_key="goal", help="tag in the result file name")
    device: str = flag("-dev", "--device", default="cuda", run_key="device",
                       help="cpu, cuda or cuda:N; cuda falls back to cpu")
    device_id: str = flag("-did", "--device_id", default="0", help="GPU index used with -dev cuda")
    dataset: str = flag("-data", "--dataset", default="Digits", run_key="dataset", help=_dataset_help)
    num_classes: Optional[int] = flag("-ncl", "--num_classes", default=None, type=int, minimum=2,
                                      help="number of classes (default: the dataset's, from its config.json)")
    model: str = flag("-m", "--model", default="CNN", run_key="model", help=_model_help)
    vocab_size: Optional[int] = flag("-vs", "--vocab_size", default=None, type=int, minimum=2, help=(
        "text models' vocabulary size: token ids 0..vs-1, 0 is padding (default: the dataset's, from its "
        "config.json; PFLlib passes 80 for Shakespeare, 32000 for AG_News and SogouNews)"))
    max_len: int = flag("-ml", "--max_len", default=200, minimum=1, help=(
        "text models' longest token sequence, at least the dataset's (it sizes the Transformer's position table)"))
    batch_size: int = flag("-lbs", "--batch_size", default=10, minimum=1, run_key="batch-size",
                           help="local minibatch size")
    local_learning_rate: float = flag("-lr", "--local_learning_rate", default=0.005, above=0,
                                      run_key="learning-rate", help="clients' SGD learning rate")
    learning_rate_decay: bool = flag("-ld", "--learning_rate_decay", default=False,
                                     help="exponential lr decay, one step per local training")
    learning_rate_decay_gamma: float = flag("-ldg", "--learning_rate_decay_gamma", default=0.99,
                                            help="decay factor of -ld")
    global_rounds: int = flag("-gr", "--global_rounds", default=2000, minimum=0, help="rounds 0..gr are run")
    top_cnt: int = flag("-tc", "--top_cnt", default=100, help="patience of -ab")
    local_epochs: int = flag("-ls", "--local_epochs", default=1, minimum=0, run_key="local-epochs",
                             help="local epochs per round")
    algorithm: str = flag("-algo", "--algorithm", default="FedAvg", help=_algorithm_help)
    join_ratio: float = flag("-jr", "--join_ratio", default=1.0, above=0, maximum=1,
                             help="fraction of clients per round, in (0, 1]")
    random_join_ratio: bool = flag("-rjr", "--random_join_ratio", default=False,
                                   help="draw each round's count in [jr*nc, nc]")
    num_clients: int = flag("-nc", "--num_clients", default=20, minimum=1, run_key="num-clients",
                            help="clients taking part (the dataset must hold at least -nc plus -nnc)")
    prev: int = flag("-pv", "--prev", default=0, help="first run index")
    times: int = flag("-t", "--times", default=1, help="runs prev..times-1")
    eval_gap: int = flag("-eg", "--eval_gap", default=1, minimum=1, help="evaluate every eg rounds")
    eval_clients: int = flag("--eval_clients", default=0, minimum=0, help=(
        "evaluate a fixed sample of this many clients, drawn once from --seed (the same clients at every "
        "evaluation, listed in the .h5 as rs_eval_clients) instead of every client; training is unchanged "
        "(0 = every client, as PFLlib; so is a K above -nc, with a note)"))
    report_last_k: int = flag("--report_last_k", default=DEFAULT_LAST_K, minimum=1, help=(
        "also report the mean accuracy of the last K evaluations (in the .h5's summary and the end-of-run "
        "line). K counts evaluations, not rounds: with -eg 5 the last 10 evaluations span 50 rounds; a run "
        "with fewer evaluations averages all of them. Changes what is reported, never what is trained"))
    val_ratio: float = flag("--val_ratio", default=0.0, minimum=0, below=1, help=(
        "hold out this fraction of each client's train data (the same samples for every seed) as a "
        "validation set, evaluated with the test set; reports then also give the test accuracy at the "
        "evaluation with the best validation accuracy, so the round is not chosen on the test set (0 = none)"))
    eval_after_training: bool = flag("--eval_after_training", default=False, switch=True, help=(
        "also evaluate the round's trained clients after local training (rs_after_* in the .h5), beside "
        "PFLlib's evaluation after the broadcast"))
    tensorboard: bool = flag("--tensorboard", default=False, switch=True, help=(
        "write TensorBoard event files under <results>/tensorboard/<run>/ (needs the tensorboard package)"))
    auto_break: bool = flag("-ab", "--auto_break", default=False,
                            help="stop when the best accuracy is -tc evaluations old")
    dlg_eval: bool = flag("-dlg", "--dlg_eval", default=False, help=(
        "privacy evaluation: every -dlgg rounds the server plays the attacker of Deep Leakage from Gradients "
        "on each upload it receives and records how well it rebuilds the client's first -bnpc minibatches "
        "(rs_dlg_psnr, rs_dlg_ssim in the .h5; docs/command-line.md, 'DLG privacy evaluation'); image "
        "datasets only; training and every accuracy are unchanged"))
    dlg_gap: int = flag("-dlgg", "--dlg_gap", default=100, minimum=1, help=(
        "-dlg attacks the uploads of rounds 0, dlgg, 2 dlgg, ..."))
    batch_num_per_client: int = flag("-bnpc", "--batch_num_per_client", default=2, minimum=1, help=(
        "-dlg attacks each client's first bnpc minibatches of -lbs training samples (in file order), each "
        "on its own"))
    num_new_clients: int = flag("-nnc", "--num_new_clients", default=0, minimum=0,
                                help="clients nc..nc+nnc-1 held out")
    fine_tuning_epoch_new: int = flag("-ften", "--fine_tuning_epoch_new", default=0,
                                      help="new-client fine-tuning epochs")
    few_shot: int = flag("-fs", "--few_shot", default=0, minimum=0, help="keep k train samples per label (0 = all)")
    client_drop_rate: float = flag("-cdr", "--client_drop_rate", default=0.0, minimum=0, below=1,
                                   help="fraction of trained clients whose update is dropped")
    train_slow_rate: float = flag("-tsr", "--train_slow_rate", default=0.0, minimum=0, maximum=1, help=(
        "fraction of clients, int(tsr * nc) drawn once from --seed, that are slow to train: their simulated "
        "training time per minibatch is 0.01 s + 0.1 s * u, u uniform in [0, 1) drawn per client and round, "
        "against 0.01 s for the others (docs/command-line.md, 'Simulated client time'); no client sleeps and "
        "training is unchanged"))
    send_slow_rate: float = flag("-ssr", "--send_slow_rate", default=0.0, minimum=0, maximum=1, help=(
        "fraction of clients, int(ssr * nc) drawn once from --seed, that are slow to receive the model: their "
        "simulated sending time per round is 0.01 s + 1 s * v, v uniform in [0, 1), against 0.01 s"))
    time_select: bool = flag("-ts", "--time_select", default=False, help=(
        "leave out of aggregation the uploads of clients whose simulated time (mean training time over the "
        "rounds it trained plus mean sending time over the rounds so far) exceeds -tth; the .h5 lists them "
        "per round as rs_time_left_out"))
    time_threthold: float = flag("-tth", "--time_threthold", "--time_threshold", default=10000.0, above=0, help=(
        "-ts's limit on a client's simulated time, in simulated seconds (PFLlib's spelling; --time_threshold "
        "is accepted too)"))
    feature_dim: int = flag("-fd", "--feature_dim", default=512, minimum=1, help=(
        "width of the text models' embeddings and hidden features (LSTM, BiLSTM, fastText, TextCNN, "
        "Transformer, whose 8 attention heads need a multiple of 8), as in PFLlib; other models have fixed "
        "widths and ignore it"))
    save_folder_name: str = flag("-sfn", "--save_folder_name", default="items", help=(
        "PFLlib's folder for items its algorithms save; this project saves no such items (checkpoints go "
        "under --results_dir, spilled client state under the checkpoint folder), so it changes nothing"))
    seed: int = flag("--seed", default=0, run_key="seed", help=(
        f"seeds Python, NumPy, torch and client sampling; run i of -t uses seed + i, in 0..{MAX_SEED}"))
    data_dir: Optional[str] = flag("--data_dir", default=None, run_key="data-dir",
                                   help="folder holding <dataset>/ (default: dataset/)")
    results_dir: Optional[str] = flag("--results_dir", default=None, run_key="results-dir",
                                      help="folder for .h5 results (default: results/)")
    overwrite: bool = flag("--overwrite", default=False, switch=True, help=(
        "replace a results file that holds a complete run made with other flags (without it such a run is "
        "kept and this one refused, naming the flags that differ); a run of the same flags is always replaced"))
    checkpoint_every: int = flag("--checkpoint_every", default=0, minimum=0,
                                 help="write a checkpoint every N rounds under <results>/checkpoints/ (0 = never)")
    resume: bool = flag("-rs", "--resume", default=False,
                        help="continue from the newest checkpoint of the same run (same flags)")
    executor: str = flag("--executor", default="auto", choices=EXECUTORS, help=(
        "how clients train and are evaluated: auto (worker processes of this machine where cores are free "
        "and clients are large enough to pay, else one after another; the run's first lines say which), "
        "sequential (one after another in this process), processes (--workers processes of this machine), "
        "ray (Ray workers, here or on a cluster), or batched: together, one vmapped step for all "
        "(plain-SGD algorithms; equal to sequential up to float rounding). Every executor but batched "
        "gives the same bits"))
    batch_clients: int = flag("--batch_clients", default=0, minimum=0,
                              help="--executor batched: clients trained together per group (0 = all of the round's, "
                                   "but a convolutional model on a CPU trains one at a time, faster there)")
    ray_address: str = flag("--ray_address", default="",
                            help="Ray cluster to join: 'auto' or host:port (default: empty, which starts a local Ray)")
    workers: int = flag("--workers", default=0, minimum=0, help=(
        "worker processes (--executor auto or processes) or Ray workers; 0 = as many as cores are free "
        "(Ray: 2)"))
    gpus_per_worker: float = flag("--gpus_per_worker", default=0.0, minimum=0, help="GPUs reserved per Ray worker")
    ray_timeout: float = flag("--ray_timeout", default=600.0, minimum=0, help=(
        "seconds to wait for the next client back from the Ray workers before the run stops (results so far "
        "kept); 0 waits forever"))
    state_memory: str = flag("--state_memory", default="auto", type=memory_budget, help=(
        "memory for what clients keep of their own (personal models, heads, control variates), e.g. 2G; "
        "beyond it the least recently used clients' state goes to checksummed files under the run's "
        "checkpoint folder and is read back when used, with the same results (auto = half of what the device "
        f"has free once the models and data are counted where every client's state fits there at {FLOOR_MODELS} "
        f"models' worth each, else 1/{AUTO_SHARE} of it, at least {FLOOR_MODELS} models' worth: clients are drawn "
        "at random, so keeping a share of all clients' state saves about that share of the reads)"))
    threads: int = flag("--threads", default=0, minimum=0, help=(
        "torch intra-op threads per process (0 = OMP_NUM_THREADS when exported, else 1: free cores go to worker "
        "processes instead, see --executor; a second thread pays less than a second process and beside busy "
        "processes slows every operation, see benchmarks/threads.py); results are bit-identical only for the "
        "same count, recorded in the .h5"))
    # PFLlib's shared algorithm hyper-parameters (-bt, -lam, -mu ...), then FedLAG's --lag_* flags.
    algorithm_flags: AlgorithmFlags = nested(AlgorithmFlags)
    lag: LagSettings = nested(LagSettings)

    @classmethod
    def from_namespace(cls, namespace) -> "RunConfig":
        """From argparse's namespace of the flags. Filled in here: ``--lag_warmup``'s default, and each shared
        hyper-parameter flag left out (None), at the chosen algorithm's own default."""
        own = cls(**read_namespace(cls, namespace))
        given = read_namespace(AlgorithmFlags, namespace)
        return dataclasses.replace(
            own, algorithm_flags=AlgorithmFlags.for_algorithm(hyperparameters_of(own.algorithm), given),
            lag=LagSettings.from_args(namespace))

    def flags(self) -> Dict[str, object]:
        """``{dest: value}`` of every flag, in command-line order: the run's record (see the module docstring)."""
        return flag_values(self)

    def for_run(self, run: int) -> "RunConfig":
        """The config of run ``run`` of ``-pv .. -t-1``: seeded with ``--seed + run``."""
        return dataclasses.replace(self, seed=self.seed + run)

    def problems(self) -> List[str]:
        """Every value no run can use, each naming its flag. The chosen algorithm's own bounds on the shared
        hyper-parameters are its hyper-parameter dataclass's to check; here they need only be finite."""
        problems = field_problems(self) + field_problems(self.algorithm_flags) + self.lag.problems(self.global_rounds)
        if not 0 <= self.prev < self.times:
            problems.append(f"-pv/--prev must be in [0, -t), got {self.prev} with -t {self.times}")
        seed_problem = self._seed_problem()
        if seed_problem:
            problems.append(seed_problem)
        gamma = self.learning_rate_decay_gamma
        if self.learning_rate_decay and math.isfinite(gamma) and gamma <= 0:  # a NaN is refused above
            problems.append(f"-ldg/--learning_rate_decay_gamma must be > 0 with -ld (each local training "
                            f"multiplies the learning rate by it), got {gamma}")
        return problems

    def _seed_problem(self) -> Optional[str]:
        """Why some run of ``-pv .. -t-1`` cannot be seeded with ``--seed + run``, or None: a seed outside
        0..MAX_SEED overflows torch's seeding, or NumPy's folds it onto another."""
        last = self.seed + max(self.times, 1) - 1
        if 0 <= self.seed and last <= MAX_SEED:
            return None
        if self.seed < 0 or last == self.seed:
            return f"--seed must be in [0, {MAX_SEED}] (the seeds NumPy's seeding takes), got {self.seed}"
        fix = f"use --seed <= {MAX_SEED - self.times + 1}" if self.times <= MAX_SEED + 1 else "lower -t"
        return (f"--seed {self.seed} with -t {self.times} seeds run {self.times - 1} with {last} (run i uses "
                f"--seed + i), above {MAX_SEED}, the largest seed NumPy's seeding takes; {fix}")
