"""Every problem of a batch, found before its first run and listed together: a grid that would fail in
its third hour on a mistyped name is refused at once, with everything wrong in it named.

Three layers, each as far as it can go without data:

* the values (:func:`grid.settings.resolve_settings`: numbers, plain names, seeds, partitions; here, as
  main.py names them: algorithms, models, and the generators of the datasets to build);
* the main.py flags passed on (:mod:`grid.passed_flags`);
* the command line of the runs, read by main.py's own parser and checked by its own setup checks (the
  flags' bounds, ``setup_problems``, the algorithm's hyper-parameters, the device). One command per
  algorithm, dataset folder and model stands for all its seeds: a seed enters a command only as
  ``-pv``/``-t``, and the seeds are checked with the values.
"""
from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from utils.paths import DATASET_DIR, check_name

from grid.partitions import folder_name, partition_problem
from grid.passed_flags import passed_flag_problems
from grid.plan import Plan, main_flags, model_goal, plan_runs
from grid.settings import NAMED, POSITIVE, WHOLE, Settings, checked_clients
from grid.usage import UsageError

# A grid value that refuses every run made with it: (kind, value) -> why.
Refusals = Dict[Tuple[str, str], str]
# One command's problems, by (algorithm, dataset folder, model).
CommandProblems = Dict[Tuple[str, str, str], List[str]]


@dataclass
class Checked:
    """A batch's plan and what refuses it: no run may start while ``problems`` is not empty."""
    plan: Plan
    problems: List[str] = field(default_factory=list)  # each once, in the order found
    refused: Dict[int, str] = field(default_factory=dict)  # run index -> the first problem of its own

    def error(self) -> UsageError:
        """One line for one problem; else a line saying how many, and one line for each."""
        if len(self.problems) == 1:
            return UsageError(self.problems[0])
        listed = "".join(f"\n  {problem}" for problem in self.problems)
        return UsageError(f"the grid has {len(self.problems)} problems; nothing was started:{listed}")


def check_batch(settings: Settings) -> Checked:
    """The plan of ``settings`` and every problem of it (see the module docstring)."""
    checked = Checked(plan_runs(settings), list(settings.problems))
    try:
        refusals = value_refusals(settings)
    except ImportError as err:  # an interpreter without torch can check, and run, nothing
        checked.problems.append(f"cannot check the runs: {err} (is {sys.executable} the project's Python?)")
        return checked
    passed = passed_flag_problems(settings)
    checked.problems += list(dict.fromkeys(refusals.values())) + passed
    commands: CommandProblems = {}
    # A bad -r or -c, or flags passed on that main.py cannot read, fail every command alike: listed once above.
    if not passed and POSITIVE.fullmatch(settings.clients) and WHOLE.fullmatch(settings.rounds):
        commands = command_problems(settings, refusals)
        checked.problems += listed_once(commands)
    from utils.seeding import MAX_SEED
    for i, run in enumerate(checked.plan.runs):  # each run's own reason, for the dry run
        values = [("algorithm", run.algorithm), ("model", run.model), ("dataset", run.dataset),
                  ("partition", run.partition)]
        reasons = [refusals[key] for key in values if key in refusals]
        reasons += commands.get((run.algorithm, run.data, run.model), [])
        reasons += [f"seed {run.seed} is above {MAX_SEED}"] if run.seed > MAX_SEED else []
        if reasons:
            checked.refused[i] = reasons[0]
    return checked


def value_refusals(settings: Settings) -> Refusals:
    """Each grid value that refuses every run made with it: a name that is not a plain file name (checked
    first, before any file is opened: such a name could reach outside its folder; nothing more is said of
    it), an algorithm or model main.py does not know, a dataset to build that has no generator, a partition
    its generator would refuse."""
    from app.options import check_model_name
    from flcore.registry import resolve
    checks = {"algorithm": resolve, "model": check_model_name, "dataset": generator_check(settings)}
    refusals: Refusals = {}
    for key, kind in NAMED:
        for value in getattr(settings, key):
            problem = user_error(lambda name: check_name(name, kind, UsageError), value) \
                or user_error(checks[kind], value)
            if problem:
                refusals[(kind, value)] = problem
    for partition in settings.partitions:
        problem = partition_problem(partition, checked_clients(settings))
        if problem:
            refusals[("partition", partition)] = problem
    return refusals


def generator_check(settings: Settings) -> Callable[[str], None]:
    """The check of a dataset name: one the batch builds folders of (any partition but ``-``) needs its
    ``dataset/generate_<D>.py``; a folder used as it is (``-p -``) is main.py's to look for."""
    from utils.errors import UserError
    from utils.names import unknown_name_message
    built = any(partition != "-" for partition in settings.partitions)
    generators = sorted((p.stem[len("generate_"):] for p in DATASET_DIR.glob("generate_*.py")), key=str.lower)

    def check(dataset: str) -> None:
        if built and dataset not in generators:
            raise UserError(unknown_name_message("dataset", dataset, generators, where_listed=(
                f" (no dataset/generate_{dataset}.py builds it; with -p - a folder under --data_dir is used "
                f"as it is)")))
    return check


def user_error(check: Callable[[str], object], value: str) -> Optional[str]:
    """The message of the one-line error ``check(value)`` raises, or None."""
    from utils.errors import UserError
    try:
        check(value)
    except UserError as err:
        return str(err)
    return None


def command_problems(settings: Settings, refusals: Refusals) -> CommandProblems:
    """main.py's own checks of the command of seed 0 of each algorithm, folder and model whose values
    passed (the other seeds differ only in ``-pv``/``-t``)."""
    from app.options import ReadingParser, build_parser
    parser = build_parser(ReadingParser)  # one for all: building it is most of a check's time
    found: CommandProblems = {}
    for dataset, partition, model, algorithm in itertools.product(settings.datasets, settings.partitions,
                                                                  settings.models, settings.algorithms):
        values = [("algorithm", algorithm), ("model", model), ("dataset", dataset), ("partition", partition)]
        data = folder_name(dataset, partition, checked_clients(settings))
        if not any(key in refusals for key in values) and (algorithm, data, model) not in found:
            flags = main_flags(settings, algorithm, data, model, model_goal(settings, model), 0)
            found[(algorithm, data, model)] = main_problems(flags, parser)
    return found


def listed_once(found: CommandProblems) -> List[str]:
    """Each problem of the commands once, naming the algorithms whose runs it refuses when not all."""
    algorithms = {algorithm for algorithm, _, _ in found}
    runs_of: Dict[str, List[str]] = {}
    for (algorithm, _, _), problems in found.items():
        for problem in problems:
            runs_of.setdefault(problem, [])
            if algorithm not in runs_of[problem]:
                runs_of[problem].append(algorithm)
    return [problem + ("" if set(which) == algorithms else f" (runs of {', '.join(which)})")
            for problem, which in runs_of.items()]


def main_problems(flags: List[str], parser) -> List[str]:
    """What ``system/main.py <flags>`` refuses before it reads any data."""
    from app.build import hyperparameters, resolve_device
    from app.options import read_args, setup_problems
    from utils.errors import UserError
    try:
        config = read_args(flags, parser)
    except ValueError as err:
        return [str(err)]
    problems, _ = setup_problems(config)
    try:
        resolve_device(config.device, config.device_id)
        problems += hyperparameters(config).problems()
    except UserError as err:
        problems.append(str(err))
    return problems
