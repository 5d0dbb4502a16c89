"""From parsed flags to a ready run: device, dataset, model, hyper-parameters, seeds, the server and,
with ``--resume``, its state (no global state mutated but the seeds)."""
from __future__ import annotations

import dataclasses
import os

import torch

from app.checkpoints import run_checkpoint_folder
from app.config import RunConfig
from app.memory import chosen_state_budget, memory_problem, state_memory_line
from app.options import check_model_name
from app.run import FederatedRun, run_results_file
from app.run_status import replacement_note
from app.threads import run_threads
from dataset.utils.client_files import TOKEN_INPUTS
from flcore.algorithm_flags import Hyperparameters
from flcore.clients.state_store import ClientStateStore
from flcore.registry import resolve
from flcore.trainmodel.models import TEXT_MODELS, build_model, example_batch, split_head
from utils.checkpoint import CLIENT_STATE_FOLDER
from utils.datasets import DatasetError, DatasetInfo, dataset_info, ensure_default_dataset
from utils.errors import ConfigError, UserError
from utils.paths import RESULTS_DIR, check_name, display_path
from utils.result_utils import writable_problem
from utils.run_lock import check_unlocked
from utils.seeding import seed_everything


class DeviceError(UserError, ValueError):
    pass


def resolve_device(requested: str, device_id: str = "0") -> tuple[str, str]:
    """(device, note): ``cuda`` falls back to ``cpu`` when no GPU is visible, as in PFLlib."""
    if requested == "cpu":
        return "cpu", ""
    if requested == "cuda" or requested.startswith("cuda:"):
        if not torch.cuda.is_available():
            return "cpu", "CUDA is not available; running on the CPU"
        return (requested if ":" in requested else f"cuda:{device_id.split(',')[0]}"), ""
    if requested == "mps":
        if not torch.backends.mps.is_available():
            return "cpu", "MPS is not available; running on the CPU"
        return "mps", ""
    raise DeviceError(f"unknown device {requested!r}; use cpu, cuda, cuda:N or mps")


def prepare(config: RunConfig) -> tuple[RunConfig, str]:
    """Check what the flags alone cannot tell and resolve what they leave open: the device, the class
    count and the vocabulary size (from the dataset). Returns the resolved copy and a note for the user.

    The chosen algorithm's hyper-parameters are checked here, once, before any data is read. Also builds
    the embedded dataset on first use.
    """
    device, note = resolve_device(config.device, config.device_id)
    check_name(config.goal, "-go/--goal", ConfigError)  # part of the result file's name
    threads = run_threads(config.threads, os.environ)
    if threads:
        # The intra-op thread count changes float reductions, so it is part of what makes a run repeatable.
        torch.set_num_threads(threads)
    problems = hyperparameters(config).problems()
    if problems:
        raise ConfigError("; ".join(problems))
    check_model_name(config.model)  # before any dataset is built or read
    check_results_dir(config.results_dir)
    clients = config.num_clients + config.num_new_clients
    ensure_default_dataset(config.dataset, clients, config.data_dir)
    info = dataset_info(config.dataset, clients, config.data_dir)
    if config.num_classes is not None and config.num_classes < info.num_classes:
        raise DatasetError(f"-ncl {config.num_classes} is below the {info.num_classes} classes of "
                           f"{config.dataset}; omit -ncl to use the dataset's count")
    return dataclasses.replace(config, device=device, num_classes=config.num_classes or info.num_classes,
                               vocab_size=text_vocab_size(config, info)), note


def hyperparameters(config: RunConfig) -> Hyperparameters:
    """The chosen algorithm's hyper-parameters (its registry row's dataclass, read from the shared flags)."""
    _, spec = resolve(config.algorithm)
    return spec.hyperparameters.from_flags(config.algorithm_flags)


def text_vocab_size(config: RunConfig, info: DatasetInfo):
    """``-vs`` for this dataset: its vocabulary when left out, never fewer ids than its files hold (an id
    past the embedding table would crash training). Also refuses a non-text model on token ids, and a
    ``-ml`` shorter than the dataset's sequences. Datasets of other inputs keep ``-vs`` as given."""
    if info.input_kind != TOKEN_INPUTS:
        if config.model in TEXT_MODELS:
            raise ConfigError(f"model {config.model} takes token ids, and {config.dataset} holds {info.input_kind} "
                              f"inputs; choose a model for them (-m CNN for images, AmazonMLP for vectors)")
        return config.vocab_size
    if config.model not in TEXT_MODELS:
        raise ConfigError(f"model {config.model} does not take token ids, and {config.dataset} holds texts; "
                          f"choose one of -m {', '.join(TEXT_MODELS)}")
    if config.max_len < info.input_shape[0]:
        raise ConfigError(f"-ml/--max_len {config.max_len} is below the {info.input_shape[0]} tokens per text of "
                          f"{config.dataset}; raise -ml to at least {info.input_shape[0]}")
    if config.vocab_size is None:
        return info.vocab_size
    if config.vocab_size < info.vocab_size:
        raise ConfigError(f"-vs/--vocab_size {config.vocab_size} is below the vocabulary of {config.dataset} "
                          f"({info.vocab_size} token ids); raise -vs to at least {info.vocab_size}, or omit it")
    return config.vocab_size


def check_results_dir(results_dir) -> None:
    """Refuse, before any data is read, a results folder where no file can be written."""
    folder = results_dir or RESULTS_DIR
    problem = writable_problem(folder)
    if problem:
        raise ConfigError(f"--results_dir {display_path(folder)}: cannot write there ({problem}); "
                          f"choose a writable folder")


def build_server(config: RunConfig, run: int = 0):
    """Seed run ``run`` with ``seed + run`` and build its server (model, clients and their data).

    A results name in use by another live run is refused here, before the data is read, and so is a run
    whose models and data cannot fit in the device's free memory (:mod:`app.memory`).
    """
    return build_server_saying_budget(config, run)[0]


def build_server_saying_budget(config: RunConfig, run: int = 0):
    """:func:`build_server`, and the line that says the memory budget of its clients' own state (the budget
    comes from what is free at this moment, so the line is made here, from the same figures)."""
    check_unlocked(run_results_file(config, run))
    run_config = config.for_run(run)
    seed_everything(run_config.seed)
    server_class, spec = resolve(config.algorithm)
    info = dataset_info(config.dataset, config.num_clients + config.num_new_clients, config.data_dir)
    model = build_checked_model(config.model, info.input_shape, config.num_classes, config.vocab_size, config.max_len,
                                config.feature_dim)
    problem = batch_size_problem(model, config, info)
    if problem:
        raise ConfigError(problem)
    if spec.head_split:
        model = split_head(model)
    device = torch.device(config.device)
    problem = memory_problem(model, info, config.num_clients, device, config.model, config.state_memory)
    if problem:
        raise ConfigError(problem)
    # The table of what clients own: the budget from the machine and --state_memory, its files beside the
    # run's checkpoints (a checkpoint names those of spilled clients).
    budget, how = chosen_state_budget(model, info, config.num_clients, device, config.state_memory)
    folder = run_checkpoint_folder(run_results_file(config, run), run_config) / CLIENT_STATE_FOLDER
    store = ClientStateStore(budget, folder)
    server = server_class(run_config, hyperparameters(config), run, model, info, store)
    return server, state_memory_line(budget, how, folder)


def build_run(config: RunConfig, run: int = 0) -> FederatedRun:
    """:func:`build_server`, driven by a :class:`FederatedRun`, resumed from its newest checkpoint with
    ``--resume``. A complete run of other flags under the same results name is kept (refused here, before
    any data is read) unless ``--overwrite``; any other file it replaces is named in a note."""
    note = replacement_note(run_results_file(config, run), config.for_run(run))
    if note:
        print(f"note: {note}")
    server, budget_line = build_server_saying_budget(config, run)
    print(budget_line)
    federated_run = FederatedRun(server)
    if config.resume:
        note = federated_run.resume()
        if note:
            print(f"note: {note}")
    return federated_run


def batch_size_problem(model: torch.nn.Module, config: RunConfig, info: DatasetInfo) -> str:
    """Why a model that normalises over the minibatch (its ``MIN_BATCH``) cannot train here, or ''.
    A client with fewer training samples than -lbs trains on one batch of all of them."""
    need = getattr(model, "MIN_BATCH", 1)
    if config.batch_size < need:
        return f"-m {config.model} normalises over each minibatch and needs -lbs {need} or more, got {config.batch_size}"
    sizes = info.train_samples[:config.num_clients + config.num_new_clients]
    small = [i for i, n in enumerate(sizes) if n < need]
    if small:
        return (f"-m {config.model} needs {need} training samples or more per client, and client {small[0]} of "
                f"{config.dataset} has {sizes[small[0]]}; choose another -m or dataset")
    return ""


def build_checked_model(name: str, input_shape, num_classes: int, vocab_size=None, max_len=None, feature_dim=512):
    """Build ``-m name`` and push a dummy batch through it, so a model that cannot take the dataset's
    inputs (e.g. an image too small for its pooling) fails early, in one line."""
    try:
        model = build_model(name, input_shape, num_classes, vocab_size=vocab_size, max_len=max_len,
                            feature_dim=feature_dim)
        model.eval()
        with torch.no_grad():
            model(example_batch(name, input_shape))
        model.train()
        return model
    except RuntimeError as err:
        first_line = str(err).splitlines()[0]
        raise ConfigError(f"model {name} cannot take inputs of shape {tuple(input_shape)} ({first_line}); "
                          f"choose another -m") from None
