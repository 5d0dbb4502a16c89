"""The main.py flags a batch passes on (after ``--``, in a grid's ``args:`` and ``args.<ALGO>:``), checked
before anything runs: main.py must be able to read them, and none may set what the batch sets itself.

A run given another ``-go``, ``-t`` or ``--results_dir`` there writes its results where the batch never
looks: the batch says "done", and the next invocation runs it again. One given another ``-gr`` or ``--seed``
leaves a file the batch finds made with other flags, and reruns forever.
"""
from __future__ import annotations

from typing import List, Tuple

from grid.settings import Settings
from grid.values import words

# main.py's flags the batch sets in every run (by their dest), and the batch flag that sets each.
BATCH_OWNED = {
    "algorithm": "-a/--algorithms", "dataset": "-d/--datasets (with -p/--partitions)", "model": "-m/--models",
    "global_rounds": "-r/--rounds", "num_clients": "-c/--clients", "join_ratio": "--jr", "goal": "--goal",
    "seed": "-s/--seeds", "prev": "-s/--seeds", "times": "-s/--seeds", "data_dir": "--data_dir",
    "results_dir": "--results_dir",
}


def passed_flags(settings: Settings) -> List[Tuple[str, List[str]]]:
    """(where they were given, the flags) of every list of main.py flags the batch passes on."""
    places = [("after --", settings.main_flags), ("in the grid's args:", settings.grid_flags)]
    places += [(f"in the grid's args.{algorithm}:", words(text))
               for algorithm, text in settings.algorithm_flags.items()]
    return [(where, flags) for where, flags in places if flags]


def passed_flag_problems(settings: Settings) -> List[str]:
    """A problem for each list of flags passed on that main.py cannot read, and for each flag that sets one of
    :data:`BATCH_OWNED`, naming the batch flag to use instead."""
    from app.options import flags_given  # main.py's own parser (torch): --help and the cheap checks need none
    problems = []
    for where, flags in passed_flags(settings):
        try:
            given = flags_given(flags)
        except ValueError as err:
            problems.append(f"main.py cannot read the flags {where} ({err})")
            continue
        problems += [f"{given[dest]} {where} would override what the batch sets in every run, which would then "
                     f"write its results elsewhere, or under other flags, than the batch looks for; use "
                     f"run_all.sh's {BATCH_OWNED[dest]} instead" for dest in given if dest in BATCH_OWNED]
    return problems
