"""What to do with each planned run, from its result file: ``complete`` (skip it), ``missing``,
``incomplete`` or ``stale`` (made with other flags): run it. The rule is
:func:`app.run_status.run_status`'s; this module applies it to a plan."""
from __future__ import annotations

import sys
import traceback
from typing import List

from grid.plan import Plan
from grid.usage import UsageError

# Dry-run wording of each state.
DRY_RUN_ACTIONS = {
    "complete": "skip (complete)",
    "stale": "run (existing file made with other flags)",
    "incomplete": "run (existing file incomplete)",
}


def run_states(plan: Plan) -> List[str]:
    """One state per run of ``plan``. Imported here, not at the top: ``--help`` and usage errors need
    neither h5py nor torch, and an interpreter without them gets one line saying which one to use."""
    try:
        from app.run_status import run_status
        return [run_status(run.result_file, list(run.main_flags)) for run in plan.runs]
    except Exception:  # noqa: BLE001 - any failure here means the results cannot be judged
        traceback.print_exc()
        raise UsageError("could not read the state of existing results "
                         f"(is {sys.executable} the project's Python?)") from None


def dry_run_action(state: str) -> str:
    return DRY_RUN_ACTIONS.get(state, "run")
