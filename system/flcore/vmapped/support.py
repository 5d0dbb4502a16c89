"""What ``--executor batched`` trains: each client class declares it, and one declaration per ``-m`` model.

A client class is supported when its local training is minibatch SGD without momentum or weight decay
on its :attr:`~flcore.clients.clientbase.Client.objective` (:mod:`flcore.training.objective`: a
function of the model's parameters and buffers, the batch, and tensors fixed for the round), with
nothing happening between two steps. Its begin/end hooks (``begin_local_training``,
``end_local_training``) still run on the client object, before and after the batched steps, so hooks
that only read the model (a frozen copy of what was received, statistics of the trained model) need
nothing more.

Each class in ``flcore/clients`` says so itself, in a ``batched`` attribute of its own: a
:class:`Recipe` when supported, otherwise :class:`Refused` with the reason. The declaration is read from
the class's own ``__dict__``, never inherited, so a subclass (which may change its objective, its loop
or its hooks) is refused until it declares support itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple, Union


@dataclass(frozen=True)
class Stage:
    """One ``run_epochs`` call of the client's ``train()``: the SGD optimiser it steps (its parameters
    are the ones this stage trains) and the client attribute holding its epoch count."""
    optimizer: str = "optimizer"
    epochs: str = "local_epochs"


@dataclass(frozen=True)
class Recipe:
    """How a supported client class trains: its stages in order, each on the client's ``objective``,
    and the LR schedulers its ``train()`` steps after them under ``-ld``."""
    stages: Tuple[Stage, ...] = (Stage(),)
    schedulers: Tuple[str, ...] = ("learning_rate_scheduler",)


@dataclass(frozen=True)
class Refused:
    """A client class the engine does not train, and why (said to the user, after "cannot train X: ")."""
    reason: str


# Client.local_training: one stage of -ls epochs on the client's optimiser.
PLAIN = Recipe()
# FedRep (parttraining.train_head_then_base): the head with the base frozen, then the base with the head frozen.
HEAD_THEN_BASE = Recipe(stages=(Stage("head_optimizer", "head_epochs"), Stage("optimizer", "local_epochs")),
                        schedulers=("head_scheduler", "learning_rate_scheduler"))

# -m models: "" = supported; otherwise why not. Dropout draws its masks from the global generator
# in the order the clients run, which a step of all clients at once cannot reproduce.
MODELS: Dict[str, str] = {
    "MLR": "", "DNN": "", "CNN": "", "CNN-BN": "", "LeNet": "", "HARCNN": "", "AmazonMLP": "", "fastText": "",
    "ResNet9": "", "ResNet10": "", "ResNet18": "", "ResNet20": "", "ResNet34": "",
    "AlexNet": "it has dropout layers",
    "GoogleNet": "it has a dropout layer",
    "MobileNet": "it has a dropout layer",
    "TextCNN": "it has a dropout layer",
    "Transformer": "its encoder layers have dropout",
    "LSTM": "it has dropout, and recurrent layers over packed sequences have no vmap rule",
    "BiLSTM": "it has dropout, and recurrent layers over packed sequences have no vmap rule",
}

ALTERNATIVE = "run it with --executor sequential"


def recipe_of(cls: type) -> Union[Recipe, str]:
    """The class's own :class:`Recipe`, or the reason it is refused."""
    entry = vars(cls).get("batched")
    if isinstance(entry, Recipe):
        return entry
    if isinstance(entry, Refused):
        return entry.reason
    return (f"the client class {cls.__qualname__} is not declared for it (a class says so in a `batched` "
            f"attribute of its own, a Recipe or a Refused reason: flcore/vmapped/support.py)")


def client_problem(cls: type, algorithm: str = "") -> str:
    """One line saying why clients of ``cls`` cannot train batched, or ''."""
    entry = recipe_of(cls)
    if isinstance(entry, Recipe):
        return ""
    return f"--executor batched cannot train {algorithm or cls.__qualname__}: {entry}; {ALTERNATIVE}"


def model_problem(model: str) -> str:
    reason = MODELS.get(model)
    if reason == "":
        return ""
    if reason is None:
        reason = "the model is not declared for it (flcore/vmapped/support.py)"
    return f"--executor batched cannot train -m {model}: {reason}; {ALTERNATIVE}"


def batched_problem(algorithm: str, model: str) -> Optional[str]:
    """Why ``-algo algorithm -m model`` cannot run with ``--executor batched`` (None when it can); unknown
    names are left to the checks that name them."""
    from flcore.registry import resolve
    from flcore.trainmodel.models import MODELS as ALL_MODELS
    try:
        server_class, _ = resolve(algorithm)
    except Exception:  # noqa: BLE001 - an unknown -algo is reported by its own check
        return None
    problem = client_problem(server_class.client_class, algorithm)
    if not problem and model in ALL_MODELS:
        problem = model_problem(model)
    return problem or None
