"""The command line shared by every ``dataset/generate_<Name>.py`` script.

PFLlib's positional argv is kept (``noniid balance dir``) and named options are added::

    python dataset/generate_MNIST.py noniid - dir --num-clients 20 --alpha 0.1 \
        --source mnist.npz

:func:`main` reads and checks the options, names the output folder, leaves a folder that already holds
the split (from the same data: see :mod:`dataset.utils.source_identity`) as it is, and otherwise loads
the raw arrays and builds the dataset with
:func:`dataset.utils.generate.build_dataset`. A request the generator refuses is one ``error:`` line and
exit status 2, not a traceback.
"""
from __future__ import annotations

import argparse
from dataclasses import asdict, fields
from pathlib import Path
from typing import Callable, Optional, Sequence

from dataset.utils.client_files import DatasetFileError
from dataset.utils.feature_groups import add_feature_shift_arguments, feature_shift_from_args, refuse_feature_shift
from dataset.utils.generate import (GenerateError, GeneratorSetting, PartitionOptions, already_built,
                                    build_dataset)
from dataset.utils.naming import feature_shift_word
from dataset.utils.one_line import OneLineParser
from dataset.utils.partition import PARTITIONS, PartitionError
from dataset.utils.raw_data import RawLoader
from dataset.utils.source_identity import source_digest

DATASET_ROOT = Path(__file__).resolve().parents[1]

# What a generator prints as one line (``error: ...``, exit status 2) instead of a traceback: what it
# refuses, and what the machine refuses it (a full disk, a file-size limit, no memory left).
GENERATOR_ERRORS = (PartitionError, DatasetFileError, GenerateError, OSError, MemoryError)


def error_line(err: BaseException) -> str:
    """The ``error: ...`` line of one of :data:`GENERATOR_ERRORS`. A build that fails part-way removes its
    temporary folder, and a download what it wrote, so the dataset folder is as it was before."""
    if isinstance(err, MemoryError):
        return "error: not enough memory to build the dataset; nothing was written"
    if isinstance(err, OSError) and err.errno is not None:
        where = f" ({err.filename})" if err.filename else ""
        return f"error: cannot build the dataset: {err.strerror}{where}; nothing was left half-written"
    return f"error: {err}"


def parse_args(argv: Sequence[str], name: str, default_class_per_client: int,
               default_min_samples: Optional[int],
               defaults: Optional[PartitionOptions] = None, settings: Sequence[GeneratorSetting] = (),
               source_help: Optional[str] = None) -> argparse.Namespace:
    """PFLlib's positional argv plus named options; ``defaults`` (if given) sets the option defaults,
    ``settings`` adds the generator's own options and ``source_help`` describes its ``--source``."""
    base = defaults or PartitionOptions(class_per_client=default_class_per_client, min_samples=default_min_samples)
    parser = OneLineParser(
        prog=f"generate_{name}.py", help_command=f"python dataset/generate_{name}.py --help",
        description=f"Partition {name} into per-client train/test files under dataset/<name>/.")
    parser.add_argument("niid", nargs="?", default="noniid",
                        help="'noniid' for a non-IID split, anything else for IID (PFLlib argv[1])")
    parser.add_argument("balance", nargs="?", default="-",
                        help="'balance' for equal client sizes (PFLlib argv[2])")
    parser.add_argument("partition", nargs="?", default="dir",
                        help=f"one of {', '.join(p for p in PARTITIONS if p != 'iid')}; '-' with iid "
                             "(PFLlib argv[3])")
    parser.add_argument("--num-clients", type=int, default=base.num_clients)
    parser.add_argument("--alpha", type=float, default=base.alpha, help="Dirichlet concentration (dir, exdir)")
    parser.add_argument("--class-per-client", type=int, default=base.class_per_client,
                        help="classes per client (pat, exdir)")
    parser.add_argument("--seed", type=int, default=base.seed, help="seed of the partition (PFLlib uses 1)")
    parser.add_argument("--min-samples", type=int, default=base.min_samples,
                        help="smallest client a Dirichlet split may produce (default: PFLlib's "
                             "min(40, samples / clients / 2))")
    parser.add_argument("--label-groups", type=int, default=base.label_groups,
                        help="concept shift: clients i %% G = g > 0 see the labels permuted by group g's "
                             "own fixed permutation (1 = none)")
    add_feature_shift_arguments(parser)
    parser.add_argument("--source", type=Path, default=None,
                        help=source_help or "build from a local .npz with uint8 'x' and 'y' instead of downloading")
    for setting in settings:
        parser.add_argument(setting.flag, type=int, default=setting.default, help=setting.help)
    parser.add_argument("--name", default=None,
                        help="folder to write, i.e. the -data name (default: the dataset's name)")
    parser.add_argument("--root", type=Path, default=DATASET_ROOT,
                        help="parent folder of the dataset folder (default: dataset/)")
    parser.add_argument("--force", action="store_true",
                        help="rebuild even if the folder already holds this split, and replace a folder "
                             "that holds another split (refused without --force)")
    return parser.parse_args(list(argv))


def options_from_args(args: argparse.Namespace) -> PartitionOptions:
    non_iid = args.niid == "noniid"
    if not 1 <= args.label_groups <= args.num_clients:
        raise PartitionError(f"--label-groups must be between 1 and --num-clients ({args.num_clients}), "
                             f"got {args.label_groups}")
    scheme = args.partition if non_iid else "iid"
    if non_iid and scheme not in PARTITIONS[1:]:
        raise PartitionError(f"partition {args.partition!r} is not one of pat, dir, exdir")
    return PartitionOptions(num_clients=args.num_clients, non_iid=non_iid,
                            balance=args.balance == "balance", partition=scheme, alpha=args.alpha,
                            class_per_client=args.class_per_client, seed=args.seed,
                            min_samples=args.min_samples, label_groups=args.label_groups,
                            **feature_shift_from_args(args, args.num_clients))


def main(name: str, load_raw: RawLoader, argv: Sequence[str], *, default_class_per_client: int = 2,
         default_min_samples: Optional[int] = None, defaults: Optional[PartitionOptions] = None,
         folder_for: Optional[Callable[[PartitionOptions], str]] = None,
         settings: Sequence[GeneratorSetting] = (), source_help: Optional[str] = None,
         inputs: Optional[str] = None) -> int:
    """Entry point of a generator script; returns the process exit code.

    ``defaults`` sets the options' defaults; ``folder_for(options)`` names the folder when ``--name``
    is not given (default: ``name``) and may raise :class:`GenerateError` to demand a ``--name``.
    ``settings`` are the generator's own options (passed to ``load_raw`` by keyword). ``inputs`` names
    what a sample is when it is not an image (e.g. ``"texts"``): a feature shift is then refused
    before anything is read.
    """
    args = parse_args(argv, name, default_class_per_client, default_min_samples, defaults, settings, source_help)
    try:
        if inputs is not None:
            refuse_feature_shift(args, name, inputs)
        options = options_from_args(args)
        values = setting_values(args, settings)
        folder = args.name if args.name is not None else (folder_for(options) if folder_for else name)
        out = output_folder(args.root, folder)
        # The published data is compared before it is downloaded; a --source by the arrays read from it.
        if args.source is None and not args.force and already_built(out, options, values):
            return 0
        # The download goes under --root too: a generator writes nowhere but the folder it was given.
        x, y, *described = load_raw(args.source, Path(args.root) / name / "rawdata", **values)
        origin = source_digest(args.source, x, y)
        if args.source is not None and not args.force and already_built(out, options, values, origin):
            return 0
        extra = dict(described[0]) if described else {}
        if values:
            extra["generator_settings"] = values
        config = build_dataset(out, x, y, options, source=name, extra_config=extra, origin=origin)
    except GENERATOR_ERRORS as err:
        print(error_line(err))
        return 2
    print(f"wrote {config['num_clients']} clients to {out} "
          f"({sum(config['train_samples'])} train / {sum(config['test_samples'])} test samples)")
    return 0


def output_folder(root: Path, folder: str) -> Path:
    """``root / folder``, refusing a ``--name`` that is not a plain folder name or names a file."""
    if not folder or "/" in folder or "\\" in folder or ".." in folder:
        raise GenerateError(f"--name {folder!r} must be a plain folder name (no '/' or '..'); "
                            f"--root sets the parent folder")
    out = Path(root) / folder
    if out.exists() and not out.is_dir():
        raise GenerateError(f"{out} is a file, not a folder; pass another --name or --root")
    return out


def setting_values(args: argparse.Namespace, settings: Sequence[GeneratorSetting]) -> dict:
    """``{key: value}`` of the generator's own options, each checked against its minimum."""
    values = {}
    for setting in settings:
        value = getattr(args, setting.key)
        if value < setting.minimum:
            raise GenerateError(f"{setting.flag} must be >= {setting.minimum}, got {value}")
        values[setting.key] = value
    return values


def folder_suggestion(base: str, options: PartitionOptions, default: PartitionOptions) -> str:
    """A folder name for a non-default split, in ``run_all.sh``'s convention: ``<base>-<partition>``,
    ``-lg<G>`` with concept shift, the feature shift's word (``-rot<G>``, ``-cor<G>``: see
    :mod:`dataset.utils.naming`), and ``-nc<N>`` when the client count is not the default one
    (``Digits-dir0.5-nc10``, ``Digits-iid-lg4-nc40``, ``Digits-iid-rot4``)."""
    token = {"iid": "iid", "pat": f"pat{options.class_per_client}",
             "dir": f"dir{options.alpha:g}", "exdir": f"exdir{options.alpha:g}"}[options.partition]
    same_partition = all(getattr(options, f.name) == getattr(default, f.name) for f in fields(options)
                         if f.name in ("non_iid", "partition", "alpha", "class_per_client"))
    name = base if same_partition else f"{base}-{token}"
    if options.label_groups != default.label_groups:
        name += f"-lg{options.label_groups}"
    shift = feature_shift_word(asdict(options))
    if shift:
        name += f"-{shift}"
    return name if options.num_clients == default.num_clients else f"{name}-nc{options.num_clients}"
