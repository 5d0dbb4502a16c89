"""The generation pipeline shared by every ``dataset/generate_<Name>.py`` script.

Raw arrays -> label partition (``partition.py``) -> per-client shuffled 75/25 train/test split ->
the client's feature shift, if any (``feature_groups.py``) -> ``dataset/<name>/{train,test}/<id>.npz`` +
``config.json``. A folder that already holds the asked split is reused (:func:`already_built`); one
that holds another split is only replaced with ``--force``.

A generator may add options of its own that change the arrays rather than the split (a text dataset's
``--vocab-size`` and ``--max-len``, see :class:`GeneratorSetting`); they are recorded in ``config.json``
under ``generator_settings`` and compared on reuse like the partition. So is the data a split is cut
from, by a digest of its arrays (:mod:`dataset.utils.source_identity`).

A dataset is built in a temporary sibling folder and renamed into place when complete, so an
interrupted build never leaves old and new files mixed. ``config.json`` records a content hash of every
client's arrays. The command line that drives all this is :mod:`dataset.utils.command_line`; the raw
arrays come from :mod:`dataset.utils.raw_data` and the generators' own loaders.
"""
from __future__ import annotations

import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, List, Mapping, Optional, Sequence

import numpy as np

from dataset.utils.atomic_io import create_temp_dir, replace_folder
from dataset.utils.client_files import (CONFIG_NAME, DatasetFileError, client_file, content_hash, input_kind,
                                        read_client_arrays, read_config, write_client_arrays, write_config)
from dataset.utils.feature_groups import FeatureShift, FeatureShiftError, feature_shift_of
from dataset.utils.partition import PFLLIB_BATCH_SIZE, PartitionError, partition, split_train_test
from dataset.utils.source_identity import (SourceDigest, predates_digests, source_differences, source_digest,
                                           source_entries)


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
    # Feature shift (dataset/utils/feature_groups.py): client i's images go through group i % feature_groups'
    # transform, a quarter-turn rotation or a corruption from ``corruptions`` (one per group, comma-separated)
    # at ``corruption_severity``. 1 group: none, and the other three keep their defaults.
    feature_groups: int = 1
    feature_shift: str = "rotation"
    corruption_severity: int = 3
    corruptions: str = ""


# What build_dataset writes into a dataset folder; anything else there (e.g. downloaded ``rawdata/``)
# is carried over when the folder is rebuilt.
LAYOUT = (CONFIG_NAME, "train", "test")


class GenerateError(ValueError):
    """The generator was asked for something it must not do (e.g. overwrite another split)."""



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


def already_built(out: Path, options: PartitionOptions, settings: Optional[Mapping[str, int]] = None,
                  source: Optional[SourceDigest] = None) -> bool:
    """True (and says so) when ``out`` holds this split of ``source`` (None: of the published data, not yet
    read) intact: nothing to do. Raises :class:`GenerateError` when it holds another split, or may (a
    folder built before sources were recorded): neither is replaced without ``--force``."""
    state = existing_split_state(out, options, settings, source)
    if state == "complete":
        print(f"{out} already holds this split; nothing to do (use --force to rewrite)")
        return True
    if state.startswith("different"):
        raise GenerateError(f"{out} holds another split ({state[len('different: '):]}); pass --force "
                            f"to replace it, or --name to write another folder")
    if state == "unrecorded source":
        raise GenerateError(f"{out} was built before its source was recorded, so it may hold a split of other "
                            f"data than {source.file}; pass --force to rebuild it from {source.file}, or --name "
                            f"to write another folder")
    return False


def existing_split_state(out: Path, options: PartitionOptions, settings: Optional[Mapping[str, int]] = None,
                         source: Optional[SourceDigest] = None) -> str:
    """What folder ``out`` holds, compared with the split ``options`` (and generator ``settings``) ask for,
    built from ``source`` (None: the published data).

    ``"absent"`` (no readable ``config.json``: no split to lose), ``"complete"`` (this split, every
    file present and, where the config records hashes, intact), ``"damaged"`` (this split, files
    missing or altered), ``"different: <the differing parameters>"``, or ``"unrecorded source"`` (the
    same parameters, but the config predates recorded sources while ``source`` is a file: which data the
    folder holds is unknown).
    """
    try:
        config = read_config(out)
    except DatasetFileError:
        return "absent"
    differences = split_differences(config, options) + setting_differences(config, settings or {})
    if not differences:
        # The arrays follow from the settings (a text's vocabulary, a window's length): with another setting
        # their digest differs too, and naming it would only repeat the setting.
        differences = source_differences(config, source)
    if differences:
        return "different: " + ", ".join(differences)
    if predates_digests(config, source):
        return "unrecorded source"
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
                  extra_config: Optional[Mapping] = None, parts: Optional[List[np.ndarray]] = None,
                  origin: Optional[SourceDigest] = None) -> dict:
    """Partition ``(x, y)`` and write every client's files and the config; returns the config.

    ``source`` is the dataset's name (its generator); ``origin`` what ``(x, y)`` were read from and their
    digest (:func:`~dataset.utils.source_identity.source_digest`; None: the published data, digested
    here). ``extra_config`` is added to ``config.json``: how to read ``x`` when it is not images (its
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
    shift = feature_shift_of(options)
    clients = options.num_clients if parts is None else len(parts)
    problem = shift and shift.images_problem(x, input_kind(dict(extra_config or {})), clients)
    if problem:
        raise FeatureShiftError(problem)
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
        config = _write_clients(work, x, y, parts, rng, options, source, num_classes, label_maps, shift,
                                dict(source_entries(origin or source_digest(None, x, y)), **(extra_config or {})))
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
                   label_maps: Sequence[np.ndarray], shift: Optional[FeatureShift], extra_config: Mapping) -> dict:
    """Split each client 75/25, write its two files and, last, ``config.json`` into ``work``."""
    train_sizes: List[int] = []
    test_sizes: List[int] = []
    hashes: dict = {"train": [], "test": []}
    label_stats = []
    for client_id, indices in enumerate(terminal_progress(parts, f"writing {source or 'dataset'} clients")):
        train_idx, test_idx = split_train_test(indices, rng)
        label_map = label_maps[client_id % len(label_maps)]
        noise = shift.noise_stream(client_id) if shift else None
        for split, idx in (("train", train_idx), ("test", test_idx)):
            xs, ys = np.ascontiguousarray(x[idx]), np.ascontiguousarray(label_map[y[idx]])
            if shift:
                xs = shift.apply(xs, client_id, noise)
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
