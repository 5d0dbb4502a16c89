"""The end of a batch: how many runs were done, skipped, left to another process, failed or stopped, why
each failure happened, and the exit status (0 all done, skipped or running elsewhere, 1 some run failed,
130 interrupted)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Tuple

from grid.launcher import ELSEWHERE, SKIPPED, STOPPED, TIMED_OUT, UNBUILT, Execution
from grid.logs import last_nonblank_line
from grid.plan import Plan
from grid.settings import Settings
from grid.usage import PROGRESS

INTERRUPTED_EXIT = 130


@dataclass
class Summary:
    total: int
    done: int = 0
    skipped: int = 0
    stopped: int = 0
    not_started: int = 0
    interrupted: bool = False
    failures: List[Tuple[str, str, str]] = field(default_factory=list)  # (run name, exit text, log)
    elsewhere: List[Tuple[str, str]] = field(default_factory=list)  # (run name, who holds it)

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return INTERRUPTED_EXIT
        return 1 if self.failures else 0

    def lines(self) -> List[str]:
        """The summary line, a line per run another process holds, then two lines per failed run: its last
        log line, and the log."""
        elsewhere = f"{len(self.elsewhere)} running elsewhere, " if self.elsewhere else ""
        head = (f"{PROGRESS} {self.total} runs: {self.done} done, {self.skipped} skipped (complete), {elsewhere}"
                f"{len(self.failures)} failed")
        if self.interrupted:
            head += (f", {self.stopped} stopped and {self.not_started} not started "
                     "(interrupted: run again to continue)")
        lines = [head]
        for name, holder in self.elsewhere:
            lines.append(f"  running elsewhere: {name} ({holder}); run the batch again once it has ended")
        for name, exit_text, log in self.failures:
            lines += [f"  FAILED {name} (exit {exit_text}): {last_nonblank_line(log)}", f"         log: {log}"]
        return lines


def summarize(settings: Settings, plan: Plan, execution: Execution) -> Summary:
    summary = Summary(total=len(plan.runs), interrupted=execution.interrupted)
    for i, run in enumerate(plan.runs):
        outcome = execution.outcomes.get(i)
        log = f"{settings.logs_dir}/{run.log_name}"
        if outcome is None:
            summary.not_started += 1
        elif outcome == SKIPPED:
            summary.skipped += 1
        elif outcome == ELSEWHERE:
            summary.elsewhere.append((run.name, execution.elsewhere.get(i, "another process")))
        elif outcome == UNBUILT:
            summary.failures.append((run.name, f"dataset {run.data} not built", log))
        elif outcome == 0:
            summary.done += 1
        elif execution.interrupted and outcome == STOPPED:
            summary.stopped += 1
        elif outcome == TIMED_OUT:
            summary.failures.append((run.name, f"timed out after {settings.timeout} s", log))
        else:
            summary.failures.append((run.name, str(outcome), log))
    return summary
