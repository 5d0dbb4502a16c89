"""The command line and pipeline shared by every ``dataset/generate_<Name>.py`` script.

PFLlib's positional argv is kept (``noniid balance dir``) and named options are added::

    python dataset/generate_MNIST.py noniid - dir --num-clients 20 --alpha 0.1 \
        --source ../shared/data/mnist-70k.npz

Pipeline: raw arrays -> label partition (``partition.py``) -> per-client shuffled 75/25
train/test split -> ``dataset/<name>/{train,test}/<id>.npz`` + ``config.json``.
"""
from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from dataset.utils.client_files import (DatasetFileError, client_file, read_config,
                                        write_client_arrays, write_config)
from dataset.utils.partition import (PARTITIONS, PFLLIB_BATCH_SIZE, PartitionError, partition,
                                     split_train_test)

DATASET_ROOT = Path(__file__).resolve().parents[1]

# (source file or None, folder for downloads) -> (x float32 N x C x H x W, y int64 N)
RawLoader = Callable[[Optional[Path], Path], Tuple[np.ndarray, np.ndarray]]


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


def parse_args(argv: Sequence[str], name: str, default_class_per_client: int,
               default_min_samples: Optional[int]) -> argparse.Namespace:
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
    parser.add_argument("--num-clients", type=int, default=20)
    parser.add_argument("--alpha", type=float, default=0.1, help="Dirichlet concentration (dir, exdir)")
    parser.add_argument("--class-per-client", type=int, default=default_class_per_client,
                        help="classes per client (pat, exdir)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the partition (PFLlib uses 1)")
    parser.add_argument("--min-samples", type=int, default=default_min_samples,
                        help="smallest client a Dirichlet split may produce (default: PFLlib's "
                             "min(40, samples / clients / 2))")
    parser.add_argument("--source", type=Path, default=None,
                        help="build from a local .npz with uint8 'x' and 'y' instead of downloading")
    parser.add_argument("--name", default=name,
                        help="folder to write, i.e. the -data name (default: the dataset's name)")
    parser.add_argument("--root", type=Path, default=DATASET_ROOT,
                        help="parent folder of the dataset folder (default: dataset/)")
    parser.add_argument("--force", action="store_true", help="rewrite even if the same split exists")
    return parser.parse_args(list(argv))


def options_from_args(args: argparse.Namespace) -> PartitionOptions:
    non_iid = args.niid == "noniid"
    scheme = args.partition if non_iid else "iid"
    if non_iid and scheme not in PARTITIONS[1:]:
        raise PartitionError(f"partition {args.partition!r} is not one of pat, dir, exdir")
    return PartitionOptions(num_clients=args.num_clients, non_iid=non_iid,
                            balance=args.balance == "balance", partition=scheme, alpha=args.alpha,
                            class_per_client=args.class_per_client, seed=args.seed,
                            min_samples=args.min_samples)


def main(name: str, load_raw: RawLoader, argv: Sequence[str], *, default_class_per_client: int = 2,
         default_min_samples: Optional[int] = None) -> int:
    """Entry point of a generator script; returns the process exit code."""
    args = parse_args(argv, name, default_class_per_client, default_min_samples)
    try:
        options = options_from_args(args)
        out = args.root / args.name
        if not args.force and existing_split_matches(out, options):
            print(f"{out} already holds this split; nothing to do (use --force to rewrite)")
            return 0
        x, y = load_raw(args.source, DATASET_ROOT / name / "rawdata")
        config = build_dataset(out, x, y, options, source=name)
    except (PartitionError, DatasetFileError, FileNotFoundError) as err:
        print(f"error: {err}")
        return 2
    print(f"wrote {config['num_clients']} clients to {out} "
          f"({sum(config['train_samples'])} train / {sum(config['test_samples'])} test samples)")
    return 0


def existing_split_matches(out: Path, options: PartitionOptions) -> bool:
    try:
        config = read_config(out)
    except DatasetFileError:
        return False
    same = all(config.get(key) == value for key, value in asdict(options).items())
    return same and all(client_file(out, split, i).is_file()
                        for split in ("train", "test") for i in range(options.num_clients))


def build_dataset(out: Path, x: np.ndarray, y: np.ndarray, options: PartitionOptions, *,
                  source: str = "", num_classes: Optional[int] = None) -> dict:
    """Partition ``(x, y)`` and write every client's files and the config; returns the config."""
    y = np.asarray(y, dtype=np.int64)
    num_classes = int(y.max()) + 1 if num_classes is None else num_classes
    rng = np.random.default_rng(options.seed)
    parts = partition(y, options.num_clients, options.partition, rng, num_classes=num_classes,
                      class_per_client=options.class_per_client, alpha=options.alpha,
                      balance=options.balance, min_samples=options.min_samples)
    too_small = [i for i, p in enumerate(parts) if len(p) < 2]
    if too_small:
        raise PartitionError(f"clients {too_small[:5]} received fewer than 2 samples; lower "
                             f"--num-clients or change the partition")
    train_sizes: List[int] = []
    test_sizes: List[int] = []
    label_stats = []
    for client_id, indices in enumerate(parts):
        train_idx, test_idx = split_train_test(indices, rng)
        write_client_arrays(client_file(out, "train", client_id), x[train_idx], y[train_idx])
        write_client_arrays(client_file(out, "test", client_id), x[test_idx], y[test_idx])
        train_sizes.append(len(train_idx))
        test_sizes.append(len(test_idx))
        # Train-only counts: PFLlib mixes test samples into these statistics (issue #194).
        labels, counts = np.unique(y[train_idx], return_counts=True)
        label_stats.append([[int(k), int(c)] for k, c in zip(labels, counts)])
    config = dict(asdict(options), num_classes=num_classes, input_shape=list(x.shape[1:]),
                  batch_size=PFLLIB_BATCH_SIZE, train_samples=train_sizes, test_samples=test_sizes,
                  source=source)
    config["Size of samples for labels in clients"] = label_stats
    write_config(out, config)
    return config


def images_to_float(x: np.ndarray, max_value: float = 255.0) -> np.ndarray:
    """uint8 images (N x H x W or N x H x W x C) -> float32 N x C x H x W in [-1, 1].

    This is PFLlib's ``ToTensor`` + ``Normalize(0.5, 0.5)``, applied once at generation.
    """
    x = np.asarray(x, dtype=np.float32) / max_value
    x = x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2)
    return np.ascontiguousarray((x - 0.5) / 0.5)


def load_source_npz(source: Path) -> Tuple[np.ndarray, np.ndarray]:
    """A local copy of a dataset: uint8 ``x`` (N x H x W[, C]) and integer ``y``."""
    source = Path(source)
    if not source.is_file():
        raise FileNotFoundError(f"--source file {source} does not exist")
    with np.load(source, allow_pickle=False) as npz:
        if not {"x", "y"} <= set(npz.files):
            raise DatasetFileError(f"{source} must hold arrays 'x' and 'y', found {npz.files}")
        return images_to_float(npz["x"]), npz["y"].astype(np.int64)


def torchvision_loader(class_name: str, **kwargs) -> RawLoader:
    """A :data:`RawLoader` for ``torchvision.datasets.<class_name>``: ``--source`` file, else download."""
    def load(source: Optional[Path], raw_dir: Path) -> Tuple[np.ndarray, np.ndarray]:
        if source is not None:
            return load_source_npz(source)
        import torchvision.datasets
        return load_torchvision(getattr(torchvision.datasets, class_name), raw_dir, **kwargs)
    return load


def load_torchvision(dataset_cls, raw_dir: Path, **kwargs) -> Tuple[np.ndarray, np.ndarray]:
    """Download a torchvision dataset into ``raw_dir`` and merge its train and test splits.

    The split is merged because every client's data is re-split 75/25 after partitioning.
    """
    parts = [dataset_cls(str(raw_dir), train=train, download=True, **kwargs) for train in (True, False)]
    x = np.concatenate([np.asarray(p.data) for p in parts])
    y = np.concatenate([np.asarray(p.targets) for p in parts])
    return images_to_float(x), y.astype(np.int64)
