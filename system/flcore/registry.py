"""The one table of algorithms: ``-algo`` name -> server class, head split, shares parameters.

``X+LAG`` is not listed: it is built from ``X``'s row by :func:`resolve`, wrapping X's server in
:class:`~flcore.lag.mixin.LayerConflictMixin`. Servers are imported only when chosen, so one
algorithm's optional dependency never slows down or breaks another.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Dict, Tuple, Type

LAG_SUFFIX = "+LAG"


@dataclass(frozen=True)
class AlgorithmSpec:
    server: str               # "module:Class" inside flcore.servers
    head_split: bool          # wrap the model in BaseHeadSplit (base + head), as PFLlib's main.py does
    shares_parameters: bool   # whether some model tensors are averaged (and so X+LAG is meaningful)
    no_lag_reason: str = ""   # why X+LAG is refused, when shares_parameters is False


ALGORITHMS: Dict[str, AlgorithmSpec] = {
    "FedAvg": AlgorithmSpec("serveravg:FedAvg", head_split=True, shares_parameters=True),
    "Local": AlgorithmSpec("serverlocal:Local", head_split=False, shares_parameters=False,
                           no_lag_reason="Local trains every client alone and shares no parameters"),
}

# Names that stand for a composed algorithm.
ALIASES: Dict[str, str] = {"FedLAG": "FedAvg" + LAG_SUFFIX}


class UnknownAlgorithmError(ValueError):
    pass


def valid_names() -> list[str]:
    lag = [f"{name}{LAG_SUFFIX}" for name, spec in ALGORITHMS.items() if spec.shares_parameters]
    return list(ALGORITHMS) + list(ALIASES) + lag


def resolve(name: str) -> Tuple[Type, AlgorithmSpec]:
    """The server class and spec for ``-algo name`` (``X+LAG`` composes X with the LAG mixin)."""
    canonical = ALIASES.get(name, name)
    base_name = canonical[:-len(LAG_SUFFIX)] if canonical.endswith(LAG_SUFFIX) else canonical
    spec = ALGORITHMS.get(base_name)
    if spec is None:
        raise UnknownAlgorithmError(f"unknown algorithm {name!r}; choose one of: {', '.join(valid_names())}")
    server_class = _import(spec.server)
    if base_name == canonical:
        return server_class, spec
    if not spec.shares_parameters:
        raise UnknownAlgorithmError(f"{name} is not available: {spec.no_lag_reason}, so there are no "
                                    f"layers for FedLAG to personalise")
    from flcore.lag.mixin import with_layer_conflict
    return with_layer_conflict(server_class, canonical), spec


def _import(target: str) -> Type:
    module, cls = target.split(":")
    return getattr(importlib.import_module(f"flcore.servers.{module}"), cls)
