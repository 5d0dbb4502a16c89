"""What is on disk under a run's results name, before the run writes there: whether it is the run a
command line asks for (the batch runner's skip-or-rerun), and whether writing there would replace
another run."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

import h5py

from app.config import RunConfig
from app.options import build_parser
from flcore.flag_use import unused_flags
from utils.errors import ConfigError
from utils.paths import display_path, portable_config
from utils.result_utils import _decode
from utils.run_identity import NON_IDENTIFYING_FLAGS, identity_differences

# Replacing a file, the seed counts too: two seeds under one name are two runs (the batch runner, which
# keeps the seed in the run index, compares without it).
REPLACEMENT_IGNORED = NON_IDENTIFYING_FLAGS - {"seed"}


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
    recorded = _recorded_run(path)
    if recorded is None or not recorded[0]:
        return "incomplete"
    try:
        wanted = RunConfig.from_namespace(build_parser().parse_args(list(argv))).flags()
    except SystemExit:
        return "missing"  # the run will fail again and say why
    config = recorded[1]
    if not isinstance(config, dict):
        return "stale"
    return "stale" if differences(config, wanted, NON_IDENTIFYING_FLAGS) else "complete"


def replacement_note(path: Path, config: RunConfig) -> str:
    """What writing the run of ``config`` (one run's, seed included) to ``path`` would replace.

    Refuses (:class:`ConfigError`) to replace a complete run made with other flags unless ``--overwrite``
    is given, naming the flags that differ; returns a note, for the run's first lines, when it replaces an
    incomplete run of other flags, an unreadable file, or (with ``--overwrite``) a complete run of other
    flags; '' when nothing is lost (no file, or a run of the same flags).
    """
    path = Path(path)
    if not path.is_file():
        return ""
    recorded = _recorded_run(path)
    if recorded is None:
        return f"replacing {display_path(path)}, which is not a readable results file"
    complete, record = recorded
    record = record if isinstance(record, dict) else {}
    wanted = portable_config(config.flags())
    differing = differences(record, wanted, REPLACEMENT_IGNORED)
    if not differing:
        return ""
    changes = "; ".join(f"{_flag_name(key)} {record[key]!r} there, {wanted[key]!r} here" for key in differing)
    what = "a complete" if complete else "an incomplete"
    if complete and not config.overwrite:
        raise ConfigError(f"{display_path(path)} holds a complete run made with other flags ({changes}); it is "
                          f"kept: give this run another -go/--goal (or --results_dir), or add --overwrite to "
                          f"replace it")
    return f"replacing {display_path(path)}, {what} run made with other flags ({changes})"


def differences(recorded: Mapping[str, object], wanted: Mapping[str, object], ignored) -> List[str]:
    """The flags that make ``wanted`` another run than ``recorded``: those that identify a run
    (:func:`~utils.run_identity.identity_differences`) and that its algorithm reads (``--lag_warmup``
    changes nothing for FedAvg)."""
    unused = unused_flags(str(wanted.get("algorithm", "")), wanted)
    return [key for key in identity_differences(recorded, wanted, ignored) if key not in unused]


def _recorded_run(path: Path) -> Optional[tuple]:
    """(complete, recorded config) of a results file, or None when it cannot be read as one."""
    try:
        with h5py.File(path, "r") as f:
            return bool(f.attrs.get("complete", False)), _decode(f.attrs.get("config", "{}"))
    except (OSError, ValueError):
        return None


def _flag_name(dest: str) -> str:
    """``-gr`` for ``global_rounds``: the shortest name the command line knows the flag by."""
    return _flag_names().get(dest, f"--{dest}")


@functools.lru_cache(maxsize=1)
def _flag_names() -> Mapping[str, str]:
    names: Dict[str, str] = {}
    for action in build_parser()._actions:
        if action.option_strings:
            names[action.dest] = min(action.option_strings, key=len)
    return names
