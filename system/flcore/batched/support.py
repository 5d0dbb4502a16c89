"""What ``--executor batched`` trains: one declaration per client class and per ``-m`` model.

A client class is supported when its local training is minibatch SGD without momentum or weight decay
on its ``objective`` (:mod:`flcore.training.objective`: a function of the model's parameters and
buffers, the batch, and tensors fixed for the round), with nothing happening between two steps. Its begin/end hooks
(``begin_local_training``, ``end_local_training``) still run on the client object, before and after
the batched steps, so hooks that only read the model (a frozen copy of what was received, statistics of
the trained model) need nothing more. Every client class in ``flcore/clients`` is listed: a
:class:`Recipe` when supported, otherwise the reason it is not. The lookup is by exact class, so a
subclass (which may override ``local_loss``) is refused until it is declared here itself.
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


PLAIN = Recipe()
# FedRep (parttraining.train_head_then_base): the head with the base frozen, then the base with the head frozen.
HEAD_THEN_BASE = Recipe(stages=(Stage("head_optimizer", "head_epochs"), Stage("optimizer", "local_epochs")),
                        schedulers=("head_scheduler", "learning_rate_scheduler"))

# By module (under flcore.clients) and class name. A string is the reason the class is refused.
CLIENTS: Dict[str, Union[Recipe, str]] = {
    "clientavg.clientAVG": PLAIN,
    "clientfedlag.clientFedLAG": PLAIN,
    "clientlocal.clientLocal": PLAIN,
    "clientper.clientPer": PLAIN,
    "clientlg.clientLG": PLAIN,
    "clientbabu.clientBABU": PLAIN,          # its optimiser holds the body only: the head stays frozen
    "clientbn.clientBN": PLAIN,              # BatchNorm statistics are per client (stacked buffers)
    "clientrep.clientRep": HEAD_THEN_BASE,
    "clientprox.clientProx": PLAIN,
    "clientdyn.clientDyn": PLAIN,
    "clientntd.clientNTD": PLAIN,
    "clientlc.clientLC": PLAIN,
    "clientmoon.clientMOON": PLAIN,
    # Cross-entropy training; their own steps happen at the broadcast or in the end hook.
    "clientala.clientALA": PLAIN,
    "clientas.clientAS": PLAIN,
    "clientcac.clientCAC": PLAIN,
    "clientgh.clientGH": PLAIN,
    "clientfomo.clientFomo": PLAIN,
    # Refused.
    "clientapfl.clientAPFL": "every step also moves a private model and the mixing weight (after_step)",
    "clientamp.clientAMP": "its pull towards the per-client cloud model is not ported to the batched engine",
    "clientcp.clientCP": "every step draws Gumbel noise from the client's generator, interleaved with the "
                         "batch order",
    "clientdbe.clientDBE": "every step updates a running mean of the features and a personal bias with a "
                           "second optimiser (after_step)",
    "clientditto.clientDitto": "it trains a second, personal model for -pls epochs before the shared one",
    "clientfd.clientFD": "it collects per-label logits over every step of training",
    "clientgpfl.clientGPFL": "its optimiser applies weight decay to some parameter groups (not plain SGD)",
    "clientpFedMe.clientpFedMe": "every minibatch takes -K inner steps on a personal model, then moves the "
                                 "local model",
    "clientpac.clientPAC": "its body stage is pulled towards global prototypes with statistics measured "
                           "between the stages; not ported to the batched engine",
    "clientperavg.clientPerAvg": "every step draws two batches and takes two gradient steps (first-order MAML)",
    "clientphp.clientPHP": "its distillation from the inherited private model is not ported to the batched engine",
    "clientproto.clientProto": "its prototype regulariser is not ported to the batched engine",
    "clientrod.clientROD": "every step also trains a personal head with its own optimiser",
    "clientscaffold.clientSCAFFOLD": "every step is followed by the control-variate correction (after_step)",
}

# -m models: "" = supported; otherwise why not. Dropout draws its masks from the global generator
# in the order the clients run, which a step of all clients at once cannot reproduce.
MODELS: Dict[str, str] = {
    "MLR": "", "DNN": "", "CNN": "", "LeNet": "", "HARCNN": "", "AmazonMLP": "", "fastText": "",
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


def class_key(cls: type) -> str:
    """``clientavg.clientAVG`` for ``flcore.clients.clientavg.clientAVG``; the full path otherwise."""
    module = cls.__module__
    prefix = "flcore.clients."
    return f"{module[len(prefix):] if module.startswith(prefix) else module}.{cls.__qualname__}"


def recipe_of(cls: type) -> Union[Recipe, str]:
    """The class's :class:`Recipe`, or the reason it is refused."""
    entry = CLIENTS.get(class_key(cls))
    if entry is None:
        return (f"the client class {cls.__qualname__} is not declared for it (flcore/batched/support.py "
                f"lists the classes whose local training it reproduces)")
    return entry


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
        reason = "the model is not declared for it (flcore/batched/support.py)"
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
