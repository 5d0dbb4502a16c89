"""PFLlib's shared hyper-parameter flags, and how an algorithm declares the ones it reads.

PFLlib gives its algorithms a few generic flags (``-mu``, ``-lam``, ``-bt``, ``-K`` ...) with one default
each, and each algorithm reads some of them in its own sense (``-mu`` is FedProx's proximal weight,
MOON's contrastive weight, FedPHP's inheritance ceiling). :class:`AlgorithmFlags` is that command line,
unchanged; a run records all of it. An algorithm states what it takes as a small frozen
:class:`Hyperparameters` dataclass (``flcore/hyperparameters.py``, named in its registry row) whose
fields each :func:`reads` one shared flag, under a name of its own, with the bounds and meaning that
algorithm gives it::

    @dataclass(frozen=True)
    class FedProxParams(Hyperparameters):
        prox_weight: float = reads("mu", "FedProx's proximal weight", minimum=0)

Refusals then name the flag: ``-mu/--mu (FedProx's proximal weight) must be >= 0, got -1.0``.

The flags of the project's own algorithms that PFLlib lacks (IFCA's and CFL's) follow PFLlib's in the
same table, so that their dataclasses read them the same way.

A flag the command line leaves out takes the chosen algorithm's own default where its field declares one
(``reads("mu", ..., default=1.0)``: its paper's value, where PFLlib's shared default would refuse the
method or switch it off), else PFLlib's (:meth:`AlgorithmFlags.for_algorithm`). A flag given keeps
PFLlib's meaning and is checked against the algorithm's bounds all the same.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Dict, List, Mapping, Optional, Tuple, Type

from utils.flagfields import FLAG, field_problems, flag

SOURCE = "source"  # field metadata of a hyper-parameter: the AlgorithmFlags field it reads


def shared_flag(*names: str, default, help: str, **spec) -> dataclasses.Field:
    """A shared flag whose command line reads None when it is left out, so that the chosen algorithm's
    own default can take its place (:meth:`AlgorithmFlags.for_algorithm`)."""
    return flag(*names, default=default, help=help, command_line_default=None, **spec)


@dataclass(frozen=True)
class AlgorithmFlags:
    """PFLlib's shared hyper-parameter flags, whose meaning depends on the algorithm, then the project's own."""
    beta: float = shared_flag("-bt", "--beta", default=0.0,
                              help="pFedMe server mixing, PerAvg second step size, FedNTD loss weight, FedCAC")
    lamda: float = shared_flag("-lam", "--lamda", default=1.0,
                               help="regularisation weight: pFedMe, FedAMP, FedProto, FD, GPFL, FedCP, FedPAC, FedPHP")
    mu: float = shared_flag("-mu", "--mu", default=0.0,
                            help="proximal or contrastive weight: FedProx, Ditto, MOON, GPFL, FedPHP")
    K: int = shared_flag("-K", "--K", default=5, help="pFedMe inner steps")
    p_learning_rate: float = shared_flag("-lrp", "--p_learning_rate", default=0.01, help="pFedMe personal lr")
    M: int = shared_flag("-M", "--M", default=5, help="FedFomo models sent per client")
    alphaK: float = shared_flag("-alk", "--alphaK", default=1.0, help="FedAMP")
    sigma: float = shared_flag("-sg", "--sigma", default=1.0, help="FedAMP kernel width")
    alpha: float = shared_flag("-al", "--alpha", default=1.0, help="APFL mixing weight; FedDyn regulariser")
    plocal_epochs: int = shared_flag("-pls", "--plocal_epochs", default=1, help="Ditto personal / FedRep head epochs")
    tau: float = shared_flag("-tau", "--tau", default=1.0, help="MOON, FedNTD, FedLC temperature; FedCAC")
    fine_tuning_epochs: int = shared_flag("-fte", "--fine_tuning_epochs", default=10, help="FedBABU final fine-tuning")
    server_learning_rate: float = shared_flag("-slr", "--server_learning_rate", default=1.0,
                                              help="server step size: SCAFFOLD, FedGH")
    eta: float = shared_flag("-et", "--eta", default=1.0, help="FedALA")
    rand_percent: int = shared_flag("-s", "--rand_percent", default=80, help="FedALA")
    layer_idx: int = shared_flag("-p", "--layer_idx", default=2, help="FedALA")
    momentum: float = shared_flag("-mo", "--momentum", default=0.1, help="FedDBE")
    kl_weight: float = shared_flag("-klw", "--kl_weight", default=0.0, help="FedDBE")
    dr_learning_rate: float = shared_flag("-dlr", "--dr_learning_rate", default=0.0,
                                          help="APPLE: learning rate of the directed relationships")
    L: float = shared_flag("-L", "--L", default=1.0,
                           help="APPLE: the fraction of -gr over which the pull of the relationships towards p0 fades")
    itk: int = shared_flag("-itk", "--itk", default=4000, help=(
        "FedMTL's itk, which PFLlib reads and never uses: recorded, it changes nothing"))
    # The clustered-FL baselines' own (not PFLlib's).
    num_clusters: int = shared_flag("-ncs", "--num_clusters", default=4,
                             help="IFCA: cluster models, i.e. the number of client groups assumed")
    ifca_share_base: bool = shared_flag("--ifca_share_base", default=False, help=(
        "IFCA's weight sharing: one base averaged over every cluster's clients, a head per cluster"))
    cfl_rule: str = shared_flag("--cfl_rule", default="relative", choices=("relative", "absolute"), help=(
        "CFL's split rule: relative (--cfl_ratio, scale-free) or absolute (the authors' rule: --cfl_eps1, "
        "--cfl_eps2)"))
    cfl_ratio: float = shared_flag("--cfl_ratio", default=0.8, help=(
        "CFL, relative rule: a cluster may split once its clients' mean update is shorter than this times "
        "the length it would have were their updates orthogonal"))
    cfl_eps1: float = shared_flag("--cfl_eps1", default=0.05, help=(
        "CFL, --cfl_rule absolute: a cluster may split once the norm of its clients' mean update is below this "
        "(the authors' code: 0.4)"))
    cfl_eps2: float = shared_flag("--cfl_eps2", default=0.3, help=(
        "CFL, --cfl_rule absolute: ... and some client's update norm is above this (the authors' code: 1.6)"))
    cfl_warmup: int = shared_flag("--cfl_warmup", default=5, help="CFL: rounds 0 .. warmup-1 never split")
    cfl_linkage: str = shared_flag("--cfl_linkage", default="complete", choices=("complete", "single"), help=(
        "CFL's bipartition: complete linkage (the authors' code) or single linkage (the smallest largest "
        "similarity across the parts, the paper's stated optimum)"))
    # FedGen's generator (PFLlib's flags).
    noise_dim: int = shared_flag("-nd", "--noise_dim", default=512, help="FedGen: noise width of the feature generator")
    generator_learning_rate: float = shared_flag("-glr", "--generator_learning_rate", default=0.005,
                                                 help="FedGen: Adam learning rate of the feature generator")
    hidden_dim: int = shared_flag("-hd", "--hidden_dim", default=512, help="FedGen: hidden width of the feature generator")
    server_epochs: int = shared_flag("-se", "--server_epochs", default=1000, help="FedGen: generator steps per round")
    localize_feature_extractor: bool = shared_flag("-lf", "--localize_feature_extractor", default=False, help=(
        "FedGen: share the head only; each client keeps its feature extractor"))
    # FedKD's (PFLlib's names and defaults).
    mentee_learning_rate: float = shared_flag("-mlr", "--mentee_learning_rate", default=0.005,
                                              help="FedKD: the shared mentee's learning rate (the mentor takes -lr)")
    T_start: float = shared_flag("-Ts", "--T_start", default=0.95, help=(
        "FedKD: the share of an update's energy (squared singular values) its low-rank form keeps in round 0"))
    T_end: float = shared_flag("-Te", "--T_end", default=0.98,
                               help="FedKD: ... in the last round (the share rises linearly in between)")
    # FedCross's (PFLlib's names, spelling included, and defaults).
    first_stage_bound: int = shared_flag("-fsb", "--first_stage_bound", default=0,
                                         help="FedCross: rounds 0 .. fsb-1 are FedAvg rounds")
    fedcross_alpha: float = shared_flag("-ca", "--fedcross_alpha", default=0.99, help=(
        "FedCross: the weight a middleware model keeps of itself when fused with its collaborator"))
    collaberative_model_select_strategy: int = shared_flag(
        "-cmss", "--collaberative_model_select_strategy", default=1, choices=(0, 1, 2),
        help="FedCross's collaborator: 0 the next model in turn, 1 the least similar, 2 the most similar")

    @classmethod
    def for_algorithm(cls, hyperparameters: Type["Hyperparameters"],
                      given: Mapping[str, Optional[object]]) -> "AlgorithmFlags":
        """The shared flags of a run of the algorithm taking ``hyperparameters``: each value in ``given``
        (field name -> value, None where the command line left the flag out) as given, each flag left out
        at the algorithm's default, and the flags it does not read at PFLlib's."""
        chosen = {name: value for name, value in given.items() if value is not None}
        return cls(**{**hyperparameters.flag_defaults(), **chosen})


_SHARED = {f.name: f for f in dataclasses.fields(AlgorithmFlags)}


def reads(source: str, meaning: str, *, default: object = None, **bounds) -> dataclasses.Field:
    """A hyper-parameter read from the shared flag ``source`` (an :class:`AlgorithmFlags` field).

    ``default`` is the algorithm's own value when the flag is left out (None: PFLlib's shared default);
    ``meaning`` and ``bounds`` (``minimum``, ``above``, ``maximum``, ``below``, ``hint``) are this
    algorithm's.
    """
    shared = _SHARED[source]
    spec = dataclasses.replace(shared.metadata[FLAG], meaning=meaning, **bounds)
    own = shared.default if default is None else type(shared.default)(default)
    return dataclasses.field(default=own, metadata={FLAG: spec, SOURCE: source})


@dataclass(frozen=True)
class Hyperparameters:
    """What an algorithm takes besides the common flags; this base class is "nothing"."""
    # Shared flags read only under one value of another of the algorithm's flags: {field: (flag field,
    # value)}, AlgorithmFlags field names; a run with another value does not read the first flag.
    read_only_when: ClassVar[Mapping[str, Tuple[str, object]]] = {}

    @classmethod
    def from_flags(cls, flags: AlgorithmFlags) -> "Hyperparameters":
        return cls(**{f.name: getattr(flags, f.metadata[SOURCE]) for f in dataclasses.fields(cls)})

    @classmethod
    def flag_defaults(cls) -> Dict[str, object]:
        """``{shared flag: the value this algorithm takes when it is left out}``, for the flags it reads."""
        return {f.metadata[SOURCE]: f.default for f in dataclasses.fields(cls)}

    @classmethod
    def own_defaults(cls) -> Dict[str, object]:
        """The entries of :meth:`flag_defaults` that differ from PFLlib's shared defaults."""
        return {source: value for source, value in cls.flag_defaults().items() if value != _SHARED[source].default}

    def problems(self) -> List[str]:
        """Every value the algorithm refuses, naming its flag: the declared bounds, then :meth:`validate`."""
        return field_problems(self) + self.validate()

    def validate(self) -> List[str]:
        """Checks across fields, for an algorithm that has some (none by default)."""
        return []
