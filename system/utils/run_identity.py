"""Which flags identify a run: those that say only where and how it executes, or how it is summarised,
do not.

Used by :mod:`utils.checkpoint` (resume), :mod:`app.run_status` (whether a finished run is the one a
command line asks for) and the reports (settings).
"""
from __future__ import annotations

from typing import Iterable, List, Mapping

from utils.paths import LOCATION_FLAGS

# Flags that say where and how a run executes, not what it computes: a resumed run may change them.
EXECUTION_FLAGS = frozenset({*LOCATION_FLAGS, "resume", "checkpoint_every", "device_id", "executor", "workers",
                             "ray_address", "gpus_per_worker", "ray_timeout", "threads", "tensorboard",
                             "batch_clients", "state_memory", "overwrite",
                             "save_folder_name"})  # PFLlib's item folder: nothing is saved there
# Flags that only choose how a finished series is summarised (the .h5's ``summary``, the console line):
# training is the same whatever their value, so a resumed run may change them, a finished run made with
# another value is not stale (report.py recomputes the summary from the arrays), and a table does not
# split or label runs by them.
REPORTING_FLAGS = frozenset({"report_last_k"})
# Those, the device, and which seed (the file name says that): ignored when deciding whether a finished
# run was made with the flags asked for now.
NON_IDENTIFYING_FLAGS = EXECUTION_FLAGS | REPORTING_FLAGS | {"seed", "prev", "times", "device"}


def identity_differences(recorded: Mapping[str, object], wanted: Mapping[str, object],
                         ignored: Iterable[str] = NON_IDENTIFYING_FLAGS) -> List[str]:
    """The flags (their ``dest``) that ``wanted`` sets to another value than the run ``recorded`` (a
    results file's ``config``) did. Flags in ``ignored``, values left open (None, resolved at run time)
    and flags the record lacks (it predates them) are not compared."""
    ignored = frozenset(ignored)
    return [key for key, value in wanted.items()
            if key not in ignored and value is not None and key in recorded and recorded[key] != value]
