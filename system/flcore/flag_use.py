"""Which of a run's recorded flags its algorithm reads.

A run records every flag (the ``.h5``'s ``config``): PFLlib's shared hyper-parameters (``-mu``, ``-lam``
...) and FedLAG's ``--lag_*`` flags too, whatever the algorithm. Most of them change nothing for a given
algorithm: FedAvg reads neither ``-mu`` nor ``--lag_warmup``, and FedLAG's default schedule does not read
``--lag_warmup`` either. The reports name only flags that could have changed a result.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, FrozenSet, Mapping

from flcore.algorithm_flags import SOURCE, AlgorithmFlags
from flcore.lag.settings import SCHEDULE_ONLY_FLAGS, LagSettings, unused_by_schedule
from flcore.registry import ALGORITHMS, LAG_SUFFIX, lag_base
from utils.flagfields import FLAG, flag_fields

SHARED_HYPERPARAMETERS = frozenset(spec.dest for _, spec in flag_fields(AlgorithmFlags))
LAG_FLAGS = frozenset(spec.dest for _, spec in flag_fields(LagSettings))
# Each shared hyper-parameter's short flag (``-mu``), by its dest, for messages.
_SHARED_FLAG_NAMES = {spec.dest: spec.names[0] for _, spec in flag_fields(AlgorithmFlags)}


def reads_lag_flags(algorithm: str) -> bool:
    """FedLAG and every ``X+LAG`` read the ``--lag_*`` flags; no other algorithm does."""
    return algorithm == "FedLAG" or algorithm.endswith(LAG_SUFFIX)


def shared_flags_read(algorithm: str) -> FrozenSet[str]:
    """The shared hyper-parameters (their ``dest``, e.g. ``mu``) that ``algorithm`` (or X, for ``X+LAG``)
    reads through its hyper-parameter dataclass."""
    declared = ALGORITHMS[lag_base(algorithm)].hyperparameters
    fields = (f.metadata[SOURCE] for f in dataclasses.fields(declared))
    return frozenset(_shared_dest(name) for name in fields)


def _shared_dest(field_name: str) -> str:
    field = next(f for f in dataclasses.fields(AlgorithmFlags) if f.name == field_name)
    return field.metadata[FLAG].dest


def unused_flags(algorithm: str, config: Mapping[str, object]) -> FrozenSet[str]:
    """The keys of ``config`` (a run's recorded flags) that cannot change the results of ``algorithm``:
    the shared hyper-parameters it does not read or reads only under another setting than the recorded one
    (CFL's ``--cfl_eps1`` under ``--cfl_rule relative``), the ``--lag_*`` flags of a method without LAG,
    and those of LAG schedules other than the recorded ``lag_schedule``. Nothing for an algorithm this
    checkout does not know (e.g. a file from PFLlib): any flag may matter to it."""
    if lag_base(algorithm) not in ALGORITHMS:
        return frozenset()
    unused = (SHARED_HYPERPARAMETERS - shared_flags_read(algorithm)) | set(_unused_by_setting(algorithm, config))
    if reads_lag_flags(algorithm):
        unused |= unused_by_schedule(str(config.get("lag_schedule", "")))
    else:
        unused |= LAG_FLAGS
    return frozenset(unused & set(config))


def _unused_by_setting(algorithm: str, config: Mapping[str, object]) -> Dict[str, str]:
    """{dest: why} for the shared flags ``algorithm`` reads only under another value of one of its flags
    than ``config``'s (CFL's ``--cfl_eps1`` under ``--cfl_rule relative``); none where ``config`` does not
    record that flag."""
    declared = ALGORITHMS[lag_base(algorithm)].hyperparameters
    found = {}
    for field, (switch, value) in declared.read_only_when.items():
        switch_dest = _shared_dest(switch)
        if switch_dest in config and config[switch_dest] != value:
            found[_shared_dest(field)] = (f"only {_SHARED_FLAG_NAMES[switch_dest]} {value} reads it, and this run's "
                                          f"is {config[switch_dest]}")
    return found


def unused_reason(algorithm: str, dest: str, config: Mapping[str, object]) -> str:
    """Why flag ``dest``, one of :func:`unused_flags` ``(algorithm, config)``, changes nothing, in a few words
    (for a line that names the flag and the algorithm)."""
    if dest in LAG_FLAGS and not reads_lag_flags(algorithm):
        return f"the --lag_* flags are read by FedLAG and X{LAG_SUFFIX} only"
    if dest in LAG_FLAGS:
        readers = " or ".join(s for s, dests in SCHEDULE_ONLY_FLAGS.items() if dest in dests)
        return f"only --lag_schedule {readers} reads it, and this run's is {config.get('lag_schedule')}"
    by_setting = _unused_by_setting(algorithm, config)
    if dest in by_setting:
        return by_setting[dest]
    read = sorted(_SHARED_FLAG_NAMES[d] for d in shared_flags_read(algorithm))
    if not read:
        return f"{lag_base(algorithm)} reads none of the shared hyper-parameter flags"
    return f"of the shared hyper-parameter flags {lag_base(algorithm)} reads {', '.join(read)}"
