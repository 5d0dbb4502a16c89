"""Building the dataset folders that runs still to do need, with ``dataset/generate_<D>.py``."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Dict, List, TextIO

from utils.paths import REPO_ROOT

from grid.logs import claim_log, last_line
from grid.partitions import generator_flags
from grid.plan import Plan
from grid.settings import Settings
from grid.console import say
from grid.usage import PROGRESS


def build_datasets(settings: Settings, plan: Plan, states: List[str]) -> Dict[str, str]:
    """Generate every folder a pending run uses (a generator keeps a folder that already holds the same
    split and refuses one that holds another). Returns {folder: log} of those that could not be built:
    their runs fail without starting."""
    failed: Dict[str, str] = {}
    for data, recipe in plan.folders.items():
        if recipe is None or all(states[i] == "complete" for i in plan.runs_on(data)):
            continue
        dataset, partition = recipe
        log = f"{settings.logs_dir}/generate_{data}.log"
        script = f"{REPO_ROOT}/dataset/generate_{dataset}.py"
        if not os.path.isfile(script):
            with claimed_log(log, data) as f:
                f.write(f"no generator dataset/generate_{dataset}.py for dataset '{dataset}'\n")
            failed[data] = log
            say(f"{PROGRESS} dataset {data}: no generator dataset/generate_{dataset}.py (log {log})")
            continue
        command = [sys.executable, script, *generator_flags(partition), "--num-clients", settings.clients,
                   "--name", data, "--root", settings.data_dir]
        source = settings.source_of(dataset)
        if source:
            command += ["--source", source]
        with claimed_log(log, data) as f:
            f.write(f"# {' '.join(command)}\n")
            f.flush()
            built = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT).returncode == 0
        if built:
            say(f"{PROGRESS} dataset {data}: {last_line(log)}")
        else:
            failed[data] = log
            say(f"{PROGRESS} dataset {data} FAILED: {last_line(log)} (log {log})")
    return failed


# Seconds between two looks at a generator log that another batch holds.
CLAIM_POLL = 0.5


def claimed_log(log: str, data: str) -> TextIO:
    """The generator log of folder ``data``, claimed for this batch; while another batch holds it (it is
    building the same folder), wait: its build, once done, is what this batch's generator finds."""
    output = claim_log(log)
    if output is None:
        say(f"{PROGRESS} dataset {data}: being built by another batch; waiting for it")
    while output is None:
        time.sleep(CLAIM_POLL)
        output = claim_log(log)
    return output
