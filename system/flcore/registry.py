"""The one table of algorithms: ``-algo`` name -> server class, head split, shares parameters, its group
in ``--help`` and the README, and the hyper-parameters it takes (``flcore/hyperparameters.py``).

``X+LAG`` is not listed: it is built from ``X``'s row by :func:`resolve`, wrapping X's server in
:class:`~flcore.lag.mixin.LayerConflictMixin`. Servers are imported only when chosen, so one
algorithm's optional dependency never slows down or breaks another.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Dict, List, Tuple, Type

from flcore.algorithm_flags import Hyperparameters
from flcore.hyperparameters import (APFLParams, CFLParams, DittoParams, FDParams, FedALAParams, FedAMPParams,
                                    FedBABUParams, FedCACParams, FedCPParams, FedDBEParams, FedDynParams,
                                    FedFomoParams, FedGHParams, FedLCParams, FedNTDParams, FedPACParams,
                                    FedPHPParams, FedProtoParams, FedProxParams, FedRepParams, GPFLParams,
                                    IFCAParams, MOONParams, PerAvgParams, PFedMeParams, SCAFFOLDParams)
from flcore.hyperparameters import APPLEParams, FedMTLParams, PFLDAParams
from flcore.hyperparameters import FedGCParams, FedGenParams, FedPCLParams
from flcore.hyperparameters import FedCrossParams, FedKDParams, FMLParams
from utils.errors import UserError
from utils.names import unknown_name_message

LAG_SUFFIX = "+LAG"


# How --help and the README's Algorithms table group the -algo names (in this order).
REFERENCE = "reference"
LAYER_SPLIT = "layer split / personal heads"
REGULARISED = "regularised / full model"
PERSONAL_COPIES = "personalised copies"
CLUSTERED = "clustered"
KNOWLEDGE_SHARING = "knowledge sharing"


@dataclass(frozen=True)
class AlgorithmSpec:
    server: str               # "module:Class" inside flcore.servers
    head_split: bool          # wrap the model in BaseHeadSplit (base + head), as PFLlib's main.py does
    shares_parameters: bool   # whether some model tensors are averaged (and so X+LAG is meaningful)
    group: str                # its group in --help and the README's Algorithms table
    no_lag_reason: str = ""   # why X+LAG is refused (no shared parameters, or LAG already built in)
    # What it reads of PFLlib's shared flags (-mu, -lam ...), under its own names and bounds.
    hyperparameters: Type[Hyperparameters] = Hyperparameters


# Why the clustered methods refuse X+LAG.
CLUSTER_MODELS_ONLY = ("{} already personalises by client cluster, one model per cluster that each client "
                       "takes whole, so no client keeps layers of its own for LAG to choose")


# In the order --help lists them: group by group, as the README's Algorithms table does.
ALGORITHMS: Dict[str, AlgorithmSpec] = {
    "FedAvg": AlgorithmSpec("serveravg:FedAvg", head_split=True, shares_parameters=True, group=REFERENCE),
    "Local": AlgorithmSpec("serverlocal:Local", head_split=False, shares_parameters=False, group=REFERENCE,
                           no_lag_reason="Local trains every client alone and shares no parameters, "
                                         "so there are no layers to personalise"),
    "FedLAG": AlgorithmSpec("serverfedlag:FedLAG", head_split=True, shares_parameters=True, group=REFERENCE,
                            no_lag_reason="FedLAG already is FedAvg+LAG"),
    "FedPer": AlgorithmSpec("serverper:FedPer", head_split=True, shares_parameters=True, group=LAYER_SPLIT),
    "FedRep": AlgorithmSpec("serverrep:FedRep", head_split=True, shares_parameters=True, group=LAYER_SPLIT,
                            hyperparameters=FedRepParams),
    "FedBABU": AlgorithmSpec("serverbabu:FedBABU", head_split=True, shares_parameters=True, group=LAYER_SPLIT,
                             hyperparameters=FedBABUParams),
    "LG-FedAvg": AlgorithmSpec("serverlg:LG_FedAvg", head_split=True, shares_parameters=True, group=LAYER_SPLIT),
    "FedROD": AlgorithmSpec("serverrod:FedROD", head_split=True, shares_parameters=True, group=LAYER_SPLIT),
    "FedBN": AlgorithmSpec("serverbn:FedBN", head_split=False, shares_parameters=True, group=LAYER_SPLIT),
    "GPFL": AlgorithmSpec("servergpfl:GPFL", head_split=True, shares_parameters=True, group=LAYER_SPLIT,
                          hyperparameters=GPFLParams),
    "FedCP": AlgorithmSpec("servercp:FedCP", head_split=True, shares_parameters=True, group=LAYER_SPLIT,
                           hyperparameters=FedCPParams),
    "FedDBE": AlgorithmSpec("serverdbe:FedDBE", head_split=True, shares_parameters=True, group=LAYER_SPLIT,
                            hyperparameters=FedDBEParams),
    "FedPAC": AlgorithmSpec("serverpac:FedPAC", head_split=True, shares_parameters=True, group=LAYER_SPLIT,
                            hyperparameters=FedPACParams),
    "FedAS": AlgorithmSpec("serveras:FedAS", head_split=True, shares_parameters=True, group=LAYER_SPLIT),
    "FedGH": AlgorithmSpec("servergh:FedGH", head_split=True, shares_parameters=False, group=LAYER_SPLIT,
                           no_lag_reason="FedGH clients upload class prototypes, not parameters, so there "
                                         "are no client updates of shared layers to compare",
                           hyperparameters=FedGHParams),
    "PFL-DA": AlgorithmSpec("serverda:PFL_DA", head_split=True, shares_parameters=True, group=LAYER_SPLIT,
                            hyperparameters=PFLDAParams),
    "FedGC": AlgorithmSpec("servergc:FedGC", head_split=True, shares_parameters=True, group=LAYER_SPLIT,
                           hyperparameters=FedGCParams),
    "FedProx": AlgorithmSpec("serverprox:FedProx", head_split=False, shares_parameters=True, group=REGULARISED,
                             hyperparameters=FedProxParams),
    "FedDyn": AlgorithmSpec("serverdyn:FedDyn", head_split=False, shares_parameters=True, group=REGULARISED,
                            hyperparameters=FedDynParams),
    "MOON": AlgorithmSpec("servermoon:MOON", head_split=True, shares_parameters=True, group=REGULARISED,
                          hyperparameters=MOONParams),
    "SCAFFOLD": AlgorithmSpec("serverscaffold:SCAFFOLD", head_split=False, shares_parameters=True,
                              group=REGULARISED, hyperparameters=SCAFFOLDParams),
    "FedNTD": AlgorithmSpec("serverntd:FedNTD", head_split=False, shares_parameters=True, group=REGULARISED,
                            hyperparameters=FedNTDParams),
    "FedLC": AlgorithmSpec("serverlc:FedLC", head_split=True, shares_parameters=True, group=REGULARISED,
                           hyperparameters=FedLCParams),
    "FedALA": AlgorithmSpec("serverala:FedALA", head_split=False, shares_parameters=True, group=REGULARISED,
                            hyperparameters=FedALAParams),
    "FedCAC": AlgorithmSpec("servercac:FedCAC", head_split=False, shares_parameters=True, group=REGULARISED,
                            hyperparameters=FedCACParams),
    "FedGen": AlgorithmSpec("servergen:FedGen", head_split=True, shares_parameters=True, group=REGULARISED,
                            hyperparameters=FedGenParams),
    "FedCross": AlgorithmSpec("servercross:FedCross", head_split=True, shares_parameters=True, group=REGULARISED,
                              hyperparameters=FedCrossParams),
    "Ditto": AlgorithmSpec("serverditto:Ditto", head_split=False, shares_parameters=True, group=PERSONAL_COPIES,
                           hyperparameters=DittoParams),
    "APFL": AlgorithmSpec("serverapfl:APFL", head_split=False, shares_parameters=True, group=PERSONAL_COPIES,
                          hyperparameters=APFLParams),
    "pFedMe": AlgorithmSpec("serverpFedMe:pFedMe", head_split=False, shares_parameters=True,
                            group=PERSONAL_COPIES, hyperparameters=PFedMeParams),
    "PerAvg": AlgorithmSpec("serverperavg:PerAvg", head_split=False, shares_parameters=True,
                            group=PERSONAL_COPIES, hyperparameters=PerAvgParams),
    "FedPHP": AlgorithmSpec("serverphp:FedPHP", head_split=True, shares_parameters=True, group=PERSONAL_COPIES,
                            hyperparameters=FedPHPParams),
    "FedAMP": AlgorithmSpec("serveramp:FedAMP", head_split=False, shares_parameters=True,
                            group=PERSONAL_COPIES, hyperparameters=FedAMPParams),
    "FedFomo": AlgorithmSpec("serverfomo:FedFomo", head_split=False, shares_parameters=True,
                             group=PERSONAL_COPIES, hyperparameters=FedFomoParams),
    "FedMTL": AlgorithmSpec("servermtl:FedMTL", head_split=False, shares_parameters=True,
                            group=PERSONAL_COPIES, hyperparameters=FedMTLParams),
    "APPLE": AlgorithmSpec("serverapple:APPLE", head_split=False, shares_parameters=True,
                           group=PERSONAL_COPIES, hyperparameters=APPLEParams),
    "FML": AlgorithmSpec("serverfml:FML", head_split=False, shares_parameters=True, group=PERSONAL_COPIES,
                         hyperparameters=FMLParams),
    "FedKD": AlgorithmSpec("serverkd:FedKD", head_split=True, shares_parameters=True, group=PERSONAL_COPIES,
                           hyperparameters=FedKDParams),
    "IFCA": AlgorithmSpec("serverifca:IFCA", head_split=True, shares_parameters=True, group=CLUSTERED,
                          no_lag_reason=CLUSTER_MODELS_ONLY.format("IFCA"), hyperparameters=IFCAParams),
    "CFL": AlgorithmSpec("servercfl:CFL", head_split=True, shares_parameters=True, group=CLUSTERED,
                         no_lag_reason=CLUSTER_MODELS_ONLY.format("CFL"), hyperparameters=CFLParams),
    "FedProto": AlgorithmSpec("serverproto:FedProto", head_split=True, shares_parameters=False,
                              group=KNOWLEDGE_SHARING,
                              no_lag_reason="FedProto shares class prototypes, not parameters, so there are "
                                            "no layers to personalise",
                              hyperparameters=FedProtoParams),
    "FD": AlgorithmSpec("serverfd:FD", head_split=False, shares_parameters=False, group=KNOWLEDGE_SHARING,
                        no_lag_reason="FD shares per-class logits, not parameters, so there are no layers "
                                      "to personalise",
                        hyperparameters=FDParams),
    "FedPCL": AlgorithmSpec("serverpcl:FedPCL", head_split=True, shares_parameters=False, group=KNOWLEDGE_SHARING,
                            no_lag_reason="FedPCL shares class prototypes, not parameters, so there are no "
                                          "layers to personalise",
                            hyperparameters=FedPCLParams),
}


def algorithm_groups() -> Dict[str, Tuple[str, ...]]:
    """``{group: -algo names}``, groups and names in the order of the rows of :data:`ALGORITHMS`."""
    groups: Dict[str, List[str]] = {}
    for name, spec in ALGORITHMS.items():
        groups.setdefault(spec.group, []).append(name)
    return {group: tuple(names) for group, names in groups.items()}


class UnknownAlgorithmError(UserError, ValueError):
    pass


def algorithms_by_group() -> str:
    """The ``-algo`` names as the README's Algorithms table groups them, on one line."""
    parts = [f"{group}: {', '.join(names)}" for group, names in algorithm_groups().items()]
    return "; ".join(parts) + f"; or X{LAG_SUFFIX} for any X that shares parameters"


def lag_composable(spec: AlgorithmSpec) -> bool:
    return spec.shares_parameters and not spec.no_lag_reason


def uploads_parameters(name: str) -> bool:
    """Whether the clients of ``-algo name`` (X's, for ``X+LAG``) upload model parameters: what ``-dlg``
    attacks. False for a name this checkout does not know."""
    spec = ALGORITHMS.get(lag_base(name))
    return spec is not None and spec.shares_parameters


def lag_base(name: str) -> str:
    """``X`` for ``X+LAG``; any other name unchanged."""
    return name[:-len(LAG_SUFFIX)] if name.endswith(LAG_SUFFIX) else name


def valid_names() -> list[str]:
    lag = [f"{name}{LAG_SUFFIX}" for name, spec in ALGORITHMS.items() if lag_composable(spec)]
    return list(ALGORITHMS) + lag


def resolve(name: str) -> Tuple[Type, AlgorithmSpec]:
    """The server class and spec for ``-algo name`` (``X+LAG`` composes X with the LAG mixin)."""
    base_name = lag_base(name)
    spec = ALGORITHMS.get(base_name)
    if spec is None:
        raise UnknownAlgorithmError(unknown_name_message(
            "algorithm", name, valid_names(), algorithms_by_group(),
            f" (all {len(valid_names())}: python system/main.py --help)"))
    if base_name != name and not lag_composable(spec):
        raise UnknownAlgorithmError(f"{name} is refused: {spec.no_lag_reason}")
    server_class = _import(spec.server)
    if base_name == name:
        return server_class, spec
    from flcore.lag.mixin import with_layer_conflict
    return with_layer_conflict(server_class, name), spec


def hyperparameters_of(name: str) -> Type[Hyperparameters]:
    """What ``-algo name`` takes (X's for ``X+LAG``); :class:`Hyperparameters` itself for an unknown name,
    which :func:`resolve` refuses later with the closest valid one."""
    spec = ALGORITHMS.get(lag_base(name))
    return spec.hyperparameters if spec is not None else Hyperparameters


def own_defaults_by_flag() -> Dict[str, Dict[str, object]]:
    """``{shared flag: {-algo name: value}}``: the algorithms whose default for a shared flag differs from
    PFLlib's (``--help`` lists them beside the flag)."""
    by_flag: Dict[str, Dict[str, object]] = {}
    for name, spec in ALGORITHMS.items():
        for source, value in spec.hyperparameters.own_defaults().items():
            by_flag.setdefault(source, {})[name] = value
    return by_flag


def _import(target: str) -> Type:
    module, cls = target.split(":")
    return getattr(importlib.import_module(f"flcore.servers.{module}"), cls)
