"""Whether a results file on disk is the run a command line asks for (the batch runner's skip-or-rerun)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import h5py

from app.config import RunConfig
from app.options import build_parser
from utils.result_utils import _decode
from utils.run_identity import NON_IDENTIFYING_FLAGS


def run_status(path: Path, argv: Sequence[str]) -> str:
    """What a batch should do about the run ``argv`` of ``system/main.py`` whose file is ``path``:

    ``missing`` (no file), ``incomplete`` (a run that stopped early, e.g. diverged), ``stale`` (complete,
    but made with other flags than ``argv``: rerun it) or ``complete`` (skip it). Flags in
    :data:`NON_IDENTIFYING_FLAGS` and values left open (``None``, resolved at run time) are not compared; a
    shared hyper-parameter flag left out is compared at the algorithm's own default, as the run would take it.
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
    try:
        wanted = RunConfig.from_namespace(build_parser().parse_args(list(argv))).flags()
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
