"""The runs of a batch, each with its result file and main.py flags, and the dataset folders they use."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from grid.partitions import folder_name
from grid.settings import Settings, algorithm_flags


@dataclass(frozen=True)
class Run:
    name: str              # <data>_<algo>_<goal>-<model>_<seed>: main.py's result name for these flags
    data: str              # the dataset folder
    main_flags: Tuple[str, ...]
    result_file: str
    # The grid values it is made of, by which grid.checks refuses it.
    algorithm: str = ""
    dataset: str = ""
    partition: str = ""
    model: str = ""
    seed: int = 0

    @property
    def log_name(self) -> str:
        return f"{self.name}.log"


@dataclass
class Plan:
    runs: List[Run] = field(default_factory=list)
    # Every dataset folder in order of first use -> (dataset, partition) to generate it, or None for
    # partition "-" (the folder is used as it is).
    folders: Dict[str, Optional[Tuple[str, str]]] = field(default_factory=dict)

    def runs_on(self, data: str) -> List[int]:
        return [i for i, run in enumerate(self.runs) if run.data == data]


def plan_runs(settings: Settings) -> Plan:
    """Seeds outermost, then datasets, partitions, models and algorithms: a batch cut short has every
    method on the first seeds rather than some methods on every seed."""
    plan = Plan()
    planned = set()
    for seed in settings.seeds:
        for dataset in settings.datasets:
            for partition in settings.partitions:
                data = folder_name(dataset, partition, settings.clients)
                plan.folders.setdefault(data, None if partition == "-" else (dataset, partition))
                for model in settings.models:
                    for algorithm in settings.algorithms:
                        goal = model_goal(settings, model)
                        name = f"{data}_{algorithm}_{goal}_{seed}"
                        if name in planned:  # one result file, one run: never start the same run twice
                            continue
                        planned.add(name)
                        plan.runs.append(Run(name=name, data=data, result_file=f"{settings.results_dir}/{name}.h5",
                                             main_flags=tuple(main_flags(settings, algorithm, data, model, goal,
                                                                         seed)),
                                             algorithm=algorithm, dataset=dataset, partition=partition,
                                             model=model, seed=seed))
    return plan


def model_goal(settings: Settings, model: str) -> str:
    """The ``-go`` of a run of ``model``: the batch's goal and the model, so that a report can take each model
    apart."""
    return f"{settings.goal}-{model}"


def main_flags(settings: Settings, algorithm: str, data: str, model: str, goal: str, seed: int) -> List[str]:
    """Seed s is main.py's run index s (``--seed 0 -pv s -t s+1``): its file ends in _s and it is seeded
    with s, as a plain ``main.py -t N`` run would be."""
    flags = ["-algo", algorithm, "-data", data, "-m", model, "-gr", settings.rounds, "-nc", settings.clients,
             "-jr", settings.join_ratio, "-go", goal, "--seed", "0", "-pv", str(seed), "-t", str(seed + 1),
             "--data_dir", settings.data_dir, "--results_dir", settings.results_dir]
    if settings.device:
        flags += ["-dev", settings.device]
    if settings.checkpoint:
        flags += ["--checkpoint_every", settings.checkpoint, "--resume"]
    return flags + settings.grid_flags + algorithm_flags(settings, algorithm) + settings.main_flags
