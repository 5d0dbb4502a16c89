"""Which flags identify a run, and whether a results file on disk is the run a command line asks for.

Used by the batch runner (``system/batch``, behind ``run_all.sh``: skip or rerun), :mod:`utils.checkpoint`
(resume) and the reports (settings).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import h5py

from utils.paths import LOCATION_FLAGS
from utils.result_utils import _decode

# Flags that say where and how a run executes, not what it computes: a resumed run may change them.
EXECUTION_FLAGS = frozenset({*LOCATION_FLAGS, "resume", "checkpoint_every", "device_id", "executor", "workers",
                             "ray_address", "gpus_per_worker", "ray_timeout", "threads", "tensorboard",
                             "batch_clients"})
# Flags that only choose how a finished series is summarised (the .h5's ``summary``, the console line):
# training is the same whatever their value, so a resumed run may change them, a finished run made with
# another value is not stale (report.py recomputes the summary from the arrays), and a table does not
# split or label runs by them.
REPORTING_FLAGS = frozenset({"report_last_k"})
# Those, the device, and which seed (the file name says that): ignored when deciding whether a finished
# run was made with the flags asked for now.
NON_IDENTIFYING_FLAGS = EXECUTION_FLAGS | REPORTING_FLAGS | {"seed", "prev", "times", "device"}


def run_status(path: Path, argv: Sequence[str]) -> str:
    """What a batch should do about the run ``argv`` of ``system/main.py`` whose file is ``path``:

    ``missing`` (no file), ``incomplete`` (a run that stopped early, e.g. diverged), ``stale`` (complete,
    but made with other flags than ``argv``: rerun it) or ``complete`` (skip it). Flags in
    :data:`NON_IDENTIFYING_FLAGS` and values left open (``None``, resolved at run time) are not compared.
    """
    path = Path(path)
    if not path.is_file():
        return "missing"
    try:
        with h5py.File(path, "r") as f:
            complete = bool(f.attrs.get("complete", False))
            config = _decode(f.attrs.get("config", "{}"))
    except (OSError, ValueError):
        return "incomplete"
    if not complete:
        return "incomplete"
    from utils.options import build_parser
    try:
        wanted = vars(build_parser().parse_args(list(argv)))
    except SystemExit:
        return "missing"  # the run will fail again and say why
    if not isinstance(config, dict):
        return "stale"
    for key, value in wanted.items():
        if key in NON_IDENTIFYING_FLAGS or value is None or key not in config:
            continue
        if config[key] != value:
            return "stale"
    return "complete"
