"""Datasets split by nature: one client per group that produced the data (a play's speaking role, a
subject wearing the sensors), never by label.

Shared by ``generate_Shakespeare.py``, ``generate_HAR.py`` and ``generate_PAMAP2.py``. PFLlib's
positional argv is kept with ``natural`` as its only partition (``noniid - natural``), which is how
``config.json`` spells these splits, so the rebuild command the trainer prints from a config works::

    python dataset/generate_HAR.py noniid - natural --num-clients 30 --min-samples 2

``--num-clients N`` keeps the N groups with the most samples (0, the default: every group with at
least ``--min-samples``). A loader returns :class:`Groups`: each group's sample count, read first, so
that the choice of groups (and whether the folder already holds this split) is settled before the
chosen groups' arrays are built. Each group's samples are then split 75/25 into train and test like
every other dataset (``build_dataset(..., parts=...)``).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from dataset.utils.command_line import DATASET_ROOT, GENERATOR_ERRORS, error_line, output_folder, setting_values
from dataset.utils.feature_groups import add_feature_shift_arguments, feature_shift_from_args, refuse_feature_shift
from dataset.utils.generate import GenerateError, GeneratorSetting, PartitionOptions, already_built, build_dataset
from dataset.utils.one_line import OneLineParser
from dataset.utils.partition import PartitionError
from dataset.utils.source_identity import source_digest

NATURAL = "natural"

# Chosen groups -> (x, y, config entries): the groups' samples one group after another, in that order.
ArraysOf = Callable[[Sequence[Any]], Tuple[np.ndarray, np.ndarray, dict]]


@dataclass(frozen=True)
class Groups:
    """A naturally split dataset as read: each group's sample count, and its arrays once chosen.

    ``num_classes`` fixes the label count (e.g. an activity no chosen subject performed still has its
    label); None takes the largest label present plus one."""
    sizes: Mapping[Any, int]
    arrays: ArraysOf
    num_classes: Optional[int] = None


# (--source or None, folder for downloads, **generator settings) -> Groups
NaturalLoader = Callable[..., Groups]


def by_subject(x: np.ndarray, y: np.ndarray, subjects: np.ndarray, num_classes: int, inputs: dict) -> Groups:
    """:class:`Groups` of samples tagged with their subject (a sensor dataset's windows)."""
    subjects = np.asarray(subjects)
    keys, counts = np.unique(subjects, return_counts=True)

    def arrays(chosen: Sequence[Any]) -> Tuple[np.ndarray, np.ndarray, dict]:
        order = np.concatenate([np.flatnonzero(subjects == subject) for subject in chosen])
        return x[order], y[order], dict(inputs)

    # tolist(): plain Python numbers, which config.json can record.
    return Groups(dict(zip(keys.tolist(), counts.tolist())), arrays, num_classes)


def parse_args(argv: Sequence[str], name: str, unit: str, description: str, source_help: str,
               settings: Sequence[GeneratorSetting] = ()) -> argparse.Namespace:
    parser = OneLineParser(prog=f"generate_{name}.py", description=description,
                           help_command=f"python dataset/generate_{name}.py --help")
    parser.add_argument("niid", nargs="?", default="noniid", help="PFLlib argv[1]: only 'noniid'")
    parser.add_argument("balance", nargs="?", default="-", help="PFLlib argv[2]: only '-'")
    parser.add_argument("partition", nargs="?", default=NATURAL, help=f"PFLlib argv[3]: only '{NATURAL}'")
    parser.add_argument("--source", type=Path, default=None, help=source_help)
    parser.add_argument("--num-clients", type=int, default=0,
                        help=f"keep the {unit}s with the most samples (0: every {unit} with --min-samples)")
    parser.add_argument("--min-samples", type=int, default=2,
                        help=f"drop {unit}s with fewer samples (2: one train and one test sample)")
    parser.add_argument("--seed", type=int, default=1, help=f"seed of each {unit}'s train/test split")
    add_feature_shift_arguments(parser)
    for setting in settings:
        parser.add_argument(setting.flag, type=int, default=setting.default, help=setting.help)
    parser.add_argument("--name", default=name, help="folder to write, i.e. the -data name")
    parser.add_argument("--root", type=Path, default=DATASET_ROOT, help="parent folder of the dataset folder")
    parser.add_argument("--force", action="store_true", help="rebuild, or replace a folder holding another split")
    return parser.parse_args(list(argv))


def check_natural(args: argparse.Namespace, name: str, unit: str) -> None:
    """Refuse a label partition or a client count that cannot be: the split is given by the data."""
    words = (args.niid, args.balance, args.partition)
    if words != ("noniid", "-", NATURAL):
        raise GenerateError(f"{name} keeps its natural split (one client per {unit}); drop '{' '.join(words)}' "
                            f"or write 'noniid - {NATURAL}'")
    if args.min_samples < 2 or args.num_clients < 0:
        raise GenerateError("--min-samples must be >= 2 and --num-clients >= 0")


def chosen_groups(sizes: Mapping[Any, int], num_clients: int, min_samples: int, unit: str) -> List[Any]:
    """The groups that become clients: most samples first, ties in the groups' own order."""
    ranked = sorted((group for group, size in sizes.items() if size >= min_samples),
                    key=lambda group: (-sizes[group], group))
    if not ranked or num_clients > len(ranked):
        raise PartitionError(f"only {len(ranked)} {unit}s have at least {min_samples} samples; lower "
                             f"--num-clients or --min-samples")
    return ranked[:num_clients or len(ranked)]


def consecutive_parts(sizes: Sequence[int]) -> List[np.ndarray]:
    """Each group's sample indices when the groups' samples follow one another."""
    bounds = np.cumsum([0, *sizes])
    return [np.arange(start, stop, dtype=np.int64) for start, stop in zip(bounds[:-1], bounds[1:])]


def main(name: str, load: NaturalLoader, argv: Sequence[str], *, unit: str, description: str,
         source_help: str, settings: Sequence[GeneratorSetting] = (), inputs: Optional[str] = None) -> int:
    """Entry point of a natural-split generator; returns the process exit code (2: ``error: ...``).

    ``unit`` names a group (``role``, ``subject``): in messages, and in config.json's
    ``client_<unit>s``, which lists each client's group. ``inputs`` names what a sample is when it is
    not an image (``"sensor windows"``): a feature shift is then refused before anything is read."""
    args = parse_args(argv, name, unit, description, source_help, settings)
    try:
        check_natural(args, name, unit)
        if inputs is not None:
            refuse_feature_shift(args, name, inputs)
        feature_shift_from_args(args)  # checked before the data is read; against the client count below
        values = setting_values(args, settings)
        out = output_folder(args.root, args.name)
        groups = load(args.source, Path(args.root) / name / "rawdata", **values)
        chosen = chosen_groups(groups.sizes, args.num_clients, args.min_samples, unit)
        options = PartitionOptions(num_clients=len(chosen), partition=NATURAL, seed=args.seed,
                                   min_samples=args.min_samples, **feature_shift_from_args(args, len(chosen)))
        # The published data is compared before its arrays are built; a --source by those arrays.
        if args.source is None and not args.force and already_built(out, options, values):
            return 0
        x, y, inputs = groups.arrays(chosen)
        origin = source_digest(args.source, x, y)
        if args.source is not None and not args.force and already_built(out, options, values, origin):
            return 0
        extra = dict(inputs, **{f"client_{unit}s": list(chosen)})
        if values:
            extra["generator_settings"] = values
        config = build_dataset(out, x, y, options, source=name, num_classes=groups.num_classes,
                               parts=consecutive_parts([groups.sizes[group] for group in chosen]),
                               extra_config=extra, origin=origin)
    except GENERATOR_ERRORS as err:
        print(error_line(err))
        return 2
    print(f"wrote {config['num_clients']} {unit}s to {out} ({sum(config['train_samples'])} train / "
          f"{sum(config['test_samples'])} test samples of shape {config['input_shape']})")
    return 0
