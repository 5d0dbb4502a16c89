"""The command line and pipeline shared by every ``dataset/generate_<Name>.py`` script.

PFLlib's positional argv is kept (``noniid balance dir``) and named options are added::

    python dataset/generate_MNIST.py noniid - dir --num-clients 20 --alpha 0.1 \
        --source ../shared/data/mnist-70k.npz

Pipeline: raw arrays -> label partition (``partition.py``) -> per-client shuffled 75/25
train/test split -> ``dataset/<name>/{train,test}/<id>.npz`` + ``config.json``.

A generator may add options of its own that change the arrays rather than the split (a text dataset's
``--vocab-size`` and ``--max-len``, see :class:`GeneratorSetting`); they are recorded in ``config.json``
under ``generator_settings`` and compared on reuse like the partition.

A dataset is built in a temporary sibling folder and renamed into place when complete, so an
interrupted build never leaves old and new files mixed; a folder that holds another split is only
replaced with ``--force``. ``config.json`` records a content hash of every client's arrays.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from dataset.utils.atomic_io import create_temp_dir, replace_folder
from dataset.utils.client_files import (CONFIG_NAME, DatasetFileError, client_file, content_hash,
                                        read_client_arrays, read_config, read_xy_npz, write_client_arrays,
                                        write_config)
from dataset.utils.partition import (PARTITIONS, PFLLIB_BATCH_SIZE, PartitionError, partition,
                                     split_train_test)

DATASET_ROOT = Path(__file__).resolve().parents[1]

# (source file or None, folder for downloads, **generator settings) -> (x float32 N x C x H x W, y int64 N),
# or (x, y, inputs) where ``inputs`` are the config.json entries describing another kind of x
# (token ids: see dataset/utils/client_files.py).
RawLoader = Callable[..., tuple]


@dataclass(frozen=True)
class PartitionOptions:
    """Everything that decides a dataset's split; stored in config.json and compared on reuse."""
    num_clients: int = 20
    non_iid: bool = True
    balance: bool = False
    partition: str = "dir"
    alpha: float = 0.1
    class_per_client: int = 2
    seed: int = 1
    min_samples: Optional[int] = None  # None: PFLlib's rule (partition.least_samples)
    # Concept shift (clustered FL's label swap): client i is in group i % label_groups, and group g > 0
    # sees every label through its own fixed permutation. Same images, conflicting heads. 1: none.
    label_groups: int = 1


# What build_dataset writes into a dataset folder; anything else there (e.g. downloaded ``rawdata/``)
# is carried over when the folder is rebuilt.
LAYOUT = (CONFIG_NAME, "train", "test")


class GenerateError(ValueError):
    """The generator was asked for something it must not do (e.g. overwrite another split)."""


# What a generator prints as one line (``error: ...``, exit status 2) instead of a traceback.
GENERATOR_ERRORS = (PartitionError, DatasetFileError, GenerateError, FileNotFoundError)


@dataclass(frozen=True)
class GeneratorSetting:
    """A whole-number option of one generator that changes the arrays, not the split (e.g. a text
    dataset's vocabulary cap). Its value is passed to the raw loader as keyword ``key``, recorded in
    ``config.json`` under ``generator_settings`` and compared on reuse."""
    flag: str      # e.g. "--vocab-size"
    default: int
    help: str
    minimum: int = 1

    @property
    def key(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


def parse_args(argv: Sequence[str], name: str, default_class_per_client: int,
               default_min_samples: Optional[int],
               defaults: Optional[PartitionOptions] = None, settings: Sequence[GeneratorSetting] = (),
               source_help: Optional[str] = None) -> argparse.Namespace:
    """PFLlib's positional argv plus named options; ``defaults`` (if given) sets the option defaults,
    ``settings`` adds the generator's own options and ``source_help`` describes its ``--source``."""
    base = defaults or PartitionOptions(class_per_client=default_class_per_client, min_samples=default_min_samples)
    parser = argparse.ArgumentParser(
        prog=f"generate_{name}.py",
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
                            min_samples=args.min_samples, label_groups=args.label_groups)


def main(name: str, load_raw: RawLoader, argv: Sequence[str], *, default_class_per_client: int = 2,
         default_min_samples: Optional[int] = None, defaults: Optional[PartitionOptions] = None,
         folder_for: Optional[Callable[[PartitionOptions], str]] = None,
         settings: Sequence[GeneratorSetting] = (), source_help: Optional[str] = None) -> int:
    """Entry point of a generator script; returns the process exit code.

    ``defaults`` sets the options' defaults; ``folder_for(options)`` names the folder when ``--name``
    is not given (default: ``name``) and may raise :class:`GenerateError` to demand a ``--name``.
    ``settings`` are the generator's own options (passed to ``load_raw`` by keyword).
    """
    args = parse_args(argv, name, default_class_per_client, default_min_samples, defaults, settings, source_help)
    try:
        options = options_from_args(args)
        values = setting_values(args, settings)
        folder = args.name if args.name is not None else (folder_for(options) if folder_for else name)
        out = output_folder(args.root, folder)
        if not args.force and already_built(out, options, values):
            return 0
        # The download goes under --root too: a generator writes nowhere but the folder it was given.
        x, y, *described = load_raw(args.source, Path(args.root) / name / "rawdata", **values)
        extra = dict(described[0]) if described else {}
        if values:
            extra["generator_settings"] = values
        config = build_dataset(out, x, y, options, source=name, extra_config=extra)
    except GENERATOR_ERRORS as err:
        print(f"error: {err}")
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


def setting_differences(config: dict, values: Mapping[str, int]) -> List[str]:
    """The generator settings in which ``config`` differs from ``values``, as ``key X (asked Y)``."""
    recorded = config.get("generator_settings")
    recorded = recorded if isinstance(recorded, dict) else {}
    return [f"{key} {recorded.get(key)!r} (asked {value!r})" for key, value in values.items()
            if recorded.get(key) != value]


def split_differences(config: dict, options: PartitionOptions) -> List[str]:
    """The partition parameters in which ``config`` differs from ``options``, as ``key X (asked Y)``."""
    defaults = asdict(PartitionOptions())
    # A key the config lacks counts as the option's default: a config that does not record an option
    # describes a split made with that option at its default.
    return [f"{key} {config.get(key, defaults[key])!r} (asked {value!r})" for key, value in asdict(options).items()
            if config.get(key, defaults[key]) != value]


def already_built(out: Path, options: PartitionOptions, settings: Optional[Mapping[str, int]] = None) -> bool:
    """True (and says so) when ``out`` holds this split intact: nothing to do. Raises
    :class:`GenerateError` when it holds another split, which is never replaced without ``--force``."""
    state = existing_split_state(out, options, settings)
    if state == "complete":
        print(f"{out} already holds this split; nothing to do (use --force to rewrite)")
        return True
    if state.startswith("different"):
        raise GenerateError(f"{out} holds another split ({state[len('different: '):]}); pass --force "
                            f"to replace it, or --name to write another folder")
    return False


def existing_split_state(out: Path, options: PartitionOptions, settings: Optional[Mapping[str, int]] = None) -> str:
    """What folder ``out`` holds, compared with the split ``options`` (and generator ``settings``) ask for.

    ``"absent"`` (no readable ``config.json``: no split to lose), ``"complete"`` (this split, every
    file present and, where the config records hashes, intact), ``"damaged"`` (this split, files
    missing or altered) or ``"different: <the differing parameters>"``.
    """
    try:
        config = read_config(out)
    except DatasetFileError:
        return "absent"
    differences = split_differences(config, options) + setting_differences(config, settings or {})
    if differences:
        return "different: " + ", ".join(differences)
    return "complete" if verify_files(out, config) is None else "damaged"


def verify_files(root: Path, config: dict) -> Optional[str]:
    """``None`` when every client file under ``root`` matches ``config`` (sample counts, and content
    hashes where the config records them), else what does not."""
    hashes = config.get("content_sha256") or {}
    for split in ("train", "test"):
        sizes = config.get(f"{split}_samples")
        expected = hashes.get(split)
        for i in range(config.get("num_clients", 0)):
            path = client_file(root, split, i)
            if not path.is_file():
                return f"{path} is missing"
            if sizes is None and expected is None:
                continue
            try:
                x, y = read_client_arrays(path)
            except DatasetFileError as err:
                return str(err)
            if sizes is not None and (i >= len(sizes) or len(y) != sizes[i]):
                return f"{path} holds {len(y)} samples, not the number config.json records"
            if expected is not None and (i >= len(expected) or content_hash(x, y) != expected[i]):
                return f"{path} differs from the file the generator wrote"
    return None


def build_dataset(out: Path, x: np.ndarray, y: np.ndarray, options: PartitionOptions, *,
                  source: str = "", num_classes: Optional[int] = None, replace: bool = True,
                  extra_config: Optional[Mapping] = None, parts: Optional[List[np.ndarray]] = None) -> dict:
    """Partition ``(x, y)`` and write every client's files and the config; returns the config.

    ``extra_config`` is added to ``config.json``: how to read ``x`` when it is not images (its
    ``input_kind`` and what goes with it), and the generator's settings. ``parts`` (each client's
    sample indices) replaces the label partition for a dataset split by nature, e.g. one client per
    speaker; ``options`` then only give the seed of the train/test split and what config.json records.

    Everything is written into a temporary sibling of ``out`` that is renamed into place once complete:
    ``out`` never holds a mix of two builds, and an interrupted build leaves it as it was. With
    ``replace`` a folder already at ``out`` is replaced (entries other than the dataset's own, such as
    ``rawdata/``, are kept); without it, a folder that appeared meanwhile (another process building the
    same split) is kept and this build discarded.
    """
    out = Path(out)
    y = np.asarray(y, dtype=np.int64)
    num_classes = int(y.max()) + 1 if num_classes is None else num_classes
    rng = np.random.default_rng(options.seed)
    if parts is None:
        parts = partition(y, options.num_clients, options.partition, rng, num_classes=num_classes,
                          class_per_client=options.class_per_client, alpha=options.alpha,
                          balance=options.balance, min_samples=options.min_samples)
    label_maps = label_permutations(options.label_groups, num_classes, options.seed)
    too_small = [i for i, p in enumerate(parts) if len(p) < 2]
    if too_small:
        raise PartitionError(f"clients {too_small[:5]} received fewer than 2 samples; lower "
                             f"--num-clients or change the partition")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = create_temp_dir(out.parent, f".{out.name}.building-")
    try:
        config = _write_clients(work, x, y, parts, rng, options, source, num_classes, label_maps,
                                extra_config or {})
        if replace:
            keep = tuple(p.name for p in out.iterdir() if p.name not in LAYOUT) if out.is_dir() else ()
            replace_folder(work, out, keep=keep)
        else:
            try:
                work.rename(out)
            except OSError:
                if not (out / CONFIG_NAME).is_file():
                    raise
                return read_config(out)  # built meanwhile by another process; its files are checked on load
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return config


def label_permutations(groups: int, num_classes: int, seed: int) -> List[np.ndarray]:
    """One label map per concept-shift group: the identity for group 0, then fixed permutations.

    Drawn from their own stream, so the partition and the train/test split do not depend on them."""
    rng = np.random.default_rng([seed, 0x1abe1])
    maps = [np.arange(num_classes)]
    while len(maps) < groups:
        candidate = rng.permutation(num_classes)
        if not any(np.array_equal(candidate, m) for m in maps):
            maps.append(candidate)
    return maps


def _write_clients(work: Path, x: np.ndarray, y: np.ndarray, parts: List[np.ndarray],
                   rng: np.random.Generator, options: PartitionOptions, source: str, num_classes: int,
                   label_maps: Sequence[np.ndarray], extra_config: Mapping) -> dict:
    """Split each client 75/25, write its two files and, last, ``config.json`` into ``work``."""
    train_sizes: List[int] = []
    test_sizes: List[int] = []
    hashes: dict = {"train": [], "test": []}
    label_stats = []
    for client_id, indices in enumerate(terminal_progress(parts, f"writing {source or 'dataset'} clients")):
        train_idx, test_idx = split_train_test(indices, rng)
        label_map = label_maps[client_id % len(label_maps)]
        for split, idx in (("train", train_idx), ("test", test_idx)):
            xs, ys = np.ascontiguousarray(x[idx]), np.ascontiguousarray(label_map[y[idx]])
            write_client_arrays(client_file(work, split, client_id), xs, ys)
            hashes[split].append(content_hash(xs, ys))
        train_sizes.append(len(train_idx))
        test_sizes.append(len(test_idx))
        # Train-only counts: PFLlib mixes test samples into these statistics (issue #194).
        labels, counts = np.unique(label_map[y[train_idx]], return_counts=True)
        label_stats.append([[int(k), int(c)] for k, c in zip(labels, counts)])
    config = dict(asdict(options), num_classes=num_classes, input_shape=list(x.shape[1:]),
                  batch_size=PFLLIB_BATCH_SIZE, train_samples=train_sizes, test_samples=test_sizes,
                  source=source, content_sha256=hashes)
    config["Size of samples for labels in clients"] = label_stats
    config.update(extra_config)
    write_config(work, config)
    return config


def terminal_progress(items: Sequence, description: str) -> Iterable:
    """``items``, with a progress bar when the output is a terminal (a large dataset writes for minutes);
    unchanged in logs and pipes, which get the one summary line."""
    if not sys.stdout.isatty():
        return items
    from tqdm import tqdm
    return tqdm(items, desc=description, unit="client", leave=False)


def folder_suggestion(base: str, options: PartitionOptions, default: PartitionOptions) -> str:
    """A folder name for a non-default split, in ``run_all.sh``'s convention: ``<base>-<partition>``,
    ``-lg<G>`` with concept shift, and ``-nc<N>`` when the client count is not the default one
    (``Digits-dir0.5-nc10``, ``Digits-iid-lg4-nc40``)."""
    token = {"iid": "iid", "pat": f"pat{options.class_per_client}",
             "dir": f"dir{options.alpha:g}", "exdir": f"exdir{options.alpha:g}"}[options.partition]
    same_partition = all(getattr(options, f.name) == getattr(default, f.name) for f in fields(options)
                         if f.name in ("non_iid", "partition", "alpha", "class_per_client"))
    name = base if same_partition else f"{base}-{token}"
    if options.label_groups != default.label_groups:
        name += f"-lg{options.label_groups}"
    return name if options.num_clients == default.num_clients else f"{name}-nc{options.num_clients}"


def images_to_float(x: np.ndarray, max_value: float = 255.0) -> np.ndarray:
    """uint8 images (N x H x W or N x H x W x C) -> float32 N x C x H x W in [-1, 1].

    This is PFLlib's ``ToTensor`` + ``Normalize(0.5, 0.5)``, applied once at generation.
    """
    x = np.asarray(x, dtype=np.float32) / max_value
    x = x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2)
    return np.ascontiguousarray((x - 0.5) / 0.5)


def load_source_npz(source: Path) -> Tuple[np.ndarray, np.ndarray]:
    """A local copy of a dataset: uint8 ``x`` (N x H x W[, C]) and integer ``y``."""
    x, y = read_xy_npz(source)
    return images_to_float(x), y.astype(np.int64)


def torchvision_loader(class_name: str, **kwargs) -> RawLoader:
    """A :data:`RawLoader` for ``torchvision.datasets.<class_name>``: ``--source`` file, else download."""
    def load(source: Optional[Path], raw_dir: Path) -> Tuple[np.ndarray, np.ndarray]:
        if source is not None:
            return load_source_npz(source)
        import torchvision.datasets
        return load_torchvision(getattr(torchvision.datasets, class_name), raw_dir, **kwargs)
    return load


class DownloadError(DatasetFileError):
    """A dataset could not be downloaded; the message names ``--source`` as the offline way."""


SOURCE_HINT = ("build it offline with --source FILE.npz, a NumPy file holding uint8 images 'x' "
               "(N x H x W or N x H x W x C) and integer labels 'y'")


def load_torchvision(dataset_cls, raw_dir: Path, **kwargs) -> Tuple[np.ndarray, np.ndarray]:
    """Download a torchvision dataset into ``raw_dir`` and merge its train and test splits.

    The split is merged because every client's data is re-split 75/25 after partitioning. When the
    download fails, whatever it created under ``raw_dir`` (and ``raw_dir`` itself, and any parent
    folder it had to make) is removed, and :class:`DownloadError` says how to build the data offline.
    """
    raw_dir = Path(raw_dir)
    created_top = _first_missing_ancestor(raw_dir)
    existed = set(raw_dir.rglob("*")) if created_top is None else set()
    try:
        parts = [dataset_cls(str(raw_dir), train=train, download=True, **kwargs) for train in (True, False)]
    except BaseException as err:
        _remove_new_paths(raw_dir, created_top, existed)
        if isinstance(err, (OSError, RuntimeError)):
            reason = " ".join(str(getattr(err, "reason", None) or err).split())[:200]
            raise DownloadError(f"could not download {dataset_cls.__name__} ({reason}); {SOURCE_HINT}") from None
        raise
    x = np.concatenate([np.asarray(p.data) for p in parts])
    y = np.concatenate([np.asarray(p.targets) for p in parts])
    return images_to_float(x), y.astype(np.int64)


@contextmanager
def removed_on_failure(raw_dir: Path) -> Iterator[None]:
    """Around a download into ``raw_dir``: if it fails, remove what it created (the folders it had to
    make, or the files it added to an existing ``raw_dir``), then let the error through."""
    raw_dir = Path(raw_dir)
    created_top = _first_missing_ancestor(raw_dir)
    existed = set(raw_dir.rglob("*")) if created_top is None else set()
    try:
        yield
    except BaseException:
        _remove_new_paths(raw_dir, created_top, existed)
        raise


def _first_missing_ancestor(path: Path) -> Optional[Path]:
    """The top-most of ``path`` and its parents that does not exist yet (None when ``path`` exists)."""
    missing = None
    for candidate in (path, *path.parents):
        if candidate.exists():
            break
        missing = candidate
    return missing


def _remove_new_paths(raw_dir: Path, created_top: Optional[Path], existed: set) -> None:
    """Undo a failed download: the folders it created, or the files it added to an existing ``raw_dir``."""
    if created_top is not None:
        shutil.rmtree(created_top, ignore_errors=True)
        return
    # Deepest first, so folders are empty when their turn comes.
    for path in sorted(set(raw_dir.rglob("*")) - existed, key=lambda p: len(p.parts), reverse=True):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
