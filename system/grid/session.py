"""One batch from its settings to its summary: what to skip, the datasets, the runs, the report."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Dict, List

from utils.paths import REPO_ROOT
from utils.rounds import rounds_run

from dataset.utils.one_line import shortened

from grid.checks import Checked
from grid.console import say, warn
from grid.datasets import build_datasets
from grid.launcher import execute, run_environment
from grid.plan import Plan
from grid.run_states import dry_run_action, run_states
from grid.settings import Settings
from grid.summary import summarize
from grid.usage import PROGRESS, UsageError


@dataclass
class BatchResult:
    exit_code: int
    interrupted: bool = False
    summary_lines: List[str] = field(default_factory=list)  # empty for a dry run


def run_batch(settings: Settings, plan: Plan) -> BatchResult:
    """Run ``plan`` (or, with ``--dry-run``, say what would happen to each run). Raises
    :class:`UsageError` when existing results cannot be read or the output folders cannot be made."""
    states = run_states(plan)
    announce(settings, plan)
    if settings.dry_run:
        for run, state in zip(plan.runs, states):
            say(f"{run.name:<60} {dry_run_action(state)}\n    python system/main.py {' '.join(run.main_flags)}")
        return BatchResult(exit_code=0)
    make_folders(settings)
    unbuilt = build_datasets(settings, plan, states)
    env = run_environment()
    summary = summarize(settings, plan, execute(settings, plan, states, unbuilt, env))
    lines = summary.lines()
    say()
    for line in lines:
        say(line)
    if settings.report and summary.done + summary.skipped > 0:
        make_report(settings, env)
    return BatchResult(exit_code=summary.exit_code, interrupted=summary.interrupted, summary_lines=lines)


def show_refused(checked: Checked) -> None:
    """The dry run of a refused batch: each run, and the problem of its own that refuses it (the list of
    every problem follows, on stderr)."""
    for i, run in enumerate(checked.plan.runs):
        action = f"refused: {shortened(checked.refused[i], 100)}" if i in checked.refused else \
            "not started: the batch is refused"
        say(f"{run.name:<60} {action}\n    python system/main.py {' '.join(run.main_flags)}")


def announce(settings: Settings, plan: Plan) -> None:
    say(f"{PROGRESS} {len(plan.runs)} runs = {len(settings.algorithms)} algorithms x {len(plan.folders)} "
        f"dataset folders x {len(settings.models)} models x {len(settings.seeds)} seeds | -gr {settings.rounds}: "
        f"{rounds_run(int(settings.rounds))}, {settings.clients} clients, jr {settings.join_ratio} | goal {settings.goal} | "
        f"{settings.jobs} at once")
    say(f"{PROGRESS} datasets in {settings.data_dir}, results in {settings.results_dir}, "
        f"logs in {settings.logs_dir}")


def make_folders(settings: Settings) -> None:
    for folder in (settings.logs_dir, settings.results_dir, settings.data_dir):
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as err:
            warn(f"mkdir: cannot create directory '{folder}': {err.strerror}")
            raise UsageError(f"cannot create {settings.logs_dir}") from None


def make_report(settings: Settings, env: Dict[str, str]) -> None:
    """system/report.py on this batch's goal (one per model), into <results_dir>/report/<goal>/."""
    goals = [flag for model in settings.models for flag in ("--goal", f"{settings.goal}-{model}")]
    say()
    command = [sys.executable, f"{REPO_ROOT}/system/report.py", settings.results_dir,
               "-o", f"{settings.results_dir}/report/{settings.goal}", *goals]
    if subprocess.run(command, env=env).returncode != 0:
        warn(f"{PROGRESS} the report failed")
