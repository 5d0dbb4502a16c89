"""The commands that build or rebuild a dataset folder, for the messages that say what to run.

A folder's name in ``run_all.sh``'s convention (``MNIST-dir0.1-nc10``) or its ``config.json`` spells its
partition; these functions turn either into the exact ``dataset/generate_<Name>.py`` command.
"""
from __future__ import annotations

import math
import shlex
from dataclasses import asdict
from pathlib import Path
from typing import Mapping, Optional

from dataset.utils.feature_groups import CORRUPTION, DEFAULT_CORRUPTIONS
from dataset.utils.feature_shift import DEFAULT_SEVERITY
from dataset.utils.naming import feature_shift_from_word
from utils.paths import DATASET_DIR, display_path


def generate_command(name: str, num_clients: int, data_root: Optional[Path] = None) -> str:
    """The command that builds the missing folder ``<data_root>/<name>`` for ``num_clients`` clients
    (partition parameters spelled in a ``run_all.sh`` name, ``MNIST-dir0.1-nc10``, are kept)."""
    folder = Path(data_root or DATASET_DIR) / name
    command = rebuild_command(folder, split_from_name(name, num_clients), exists=False)
    base = generator_of(name, {})
    if command.startswith("python ") and base != "Digits":
        command += f" (offline: add {OFFLINE_SOURCES.get(base, IMAGE_SOURCE)})"
    return command


# How each generator builds without a network, for the hint of a missing dataset.
IMAGE_SOURCE = "--source FILE.npz holding uint8 x and labels y"
OFFLINE_SOURCES = {
    "AGNews": "--source FILE.csv, the CSV release's rows: class index, title, description",
    "SogouNews": "--source sogou_news_csv.tgz, its unpacked folder (train.csv, test.csv) or one CSV",
    "Shakespeare": "--source FILE.json, LEAF's preprocessed Shakespeare (required: it is never downloaded)",
    "FEMNIST": "--source FILE.json, LEAF's preprocessed FEMNIST (required: it is never downloaded)",
    "HAR": "--source 'UCI HAR Dataset.zip' or its unpacked folder",
    "PAMAP2": "--source PAMAP2_Dataset.zip or its unpacked folder",
    "TinyImagenet": "--source tiny-imagenet-200.zip, its unpacked folder, or an .npz of uint8 x and labels y",
    "Digit5": "--source FOLDER holding mnist.npz, mnistm.npz, svhn.npz, syn.npz and usps.npz",
}
# Datasets split by who made the data (one client per speaker, writer or subject), not by label.
NATURAL_SPLITS = ("Shakespeare", "FEMNIST", "HAR", "PAMAP2")
# Generators whose default split is not PFLlib's Dirichlet one (Digit5: IID within each domain).
DEFAULT_SPLITS = {"Digit5": {"non_iid": False, "partition": "iid"}}


def rebuild_command(folder: Path, split: Mapping, exists: bool = True) -> str:
    """The exact generator command that (re)builds ``folder`` with the partition ``split`` (a config
    or :class:`PartitionOptions` as a dict): its client count, scheme, alpha, seed, name and root;
    ``--force`` when the folder exists, since the generator keeps an existing folder otherwise."""
    folder = Path(folder)
    base = generator_of(folder.name, split)
    if base is None:
        return f"a generator that writes {display_path(folder)}/{{train,test}}/<id>.npz and config.json"
    non_iid = split.get("non_iid", True) is not False
    scheme = split.get("partition", "dir") if non_iid else "iid"
    words = ["python", f"dataset/generate_{base}.py", "noniid" if non_iid else "iid",
             "balance" if split.get("balance") is True else "-", scheme if non_iid else "-",
             "--num-clients", str(split.get("num_clients", 20))]
    if scheme in ("dir", "exdir") and split.get("alpha") is not None:
        words += ["--alpha", str(split["alpha"])]
    if scheme in ("pat", "exdir") and split.get("class_per_client") is not None:
        words += ["--class-per-client", str(split["class_per_client"])]
    if split.get("seed", 1) != 1:
        words += ["--seed", str(split["seed"])]
    if split.get("min_samples") is not None:
        words += ["--min-samples", str(split["min_samples"])]
    if split.get("label_groups", 1) != 1:
        words += ["--label-groups", str(split["label_groups"])]
    words += feature_shift_flags(split)
    settings = split.get("generator_settings")
    for key, value in (settings.items() if isinstance(settings, dict) else ()):
        words += [f"--{key.replace('_', '-')}", str(value)]
    if folder.name != base:
        words += ["--name", folder.name]
    if folder.parent.resolve() != DATASET_DIR.resolve():
        words += ["--root", display_path(folder.parent)]
    if exists:
        words.append("--force")
    return " ".join(shlex.quote(w) for w in words)


def generator_of(name: str, split: Mapping) -> Optional[str]:
    """The ``dataset/generate_<base>.py`` that builds folder ``name``: the config's ``source``, else the
    longest ``-``-separated prefix of the name with a generator (``MNIST-dir0.1`` -> ``MNIST``)."""
    source = split.get("source")
    parts = name.split("-")
    candidates = ([source] if isinstance(source, str) else []) + ["-".join(parts[:k]) for k in range(len(parts), 0, -1)]
    for base in candidates:
        if base and "/" not in base and "\\" not in base and (DATASET_DIR / f"generate_{base}.py").is_file():
            return base
    return None


def split_from_name(name: str, num_clients: int) -> dict:
    """Partition parameters a folder name spells in ``run_all.sh``'s convention: ``<base>-<partition>``,
    then optionally ``-lg<G>``, a feature-shift word (``-rot<G>``, ``-cor<G>``...) and ``-nc<N>``, in that
    order (a name of shifts alone, ``Digits-rot4``, is the generator's default partition shifted); the
    Digits folders hold the default split."""
    base = generator_of(name, {})
    if base == "Digits":
        digits = digits_generator()
        clients = num_clients
        if name != "Digits" and name.startswith("Digits-nc") and name[len("Digits-nc"):].isdigit():
            clients = int(name[len("Digits-nc"):])
        if name == digits.digits_folder(clients):
            return asdict(digits.digits_options(clients))
    split: dict = {"num_clients": num_clients}
    if base in NATURAL_SPLITS:
        split["partition"] = "natural"
    split.update(DEFAULT_SPLITS.get(base, {}))
    if base is None or name == base:
        return split
    words = name[len(base) + 1:].split("-")
    if words and words[-1].startswith("nc") and words[-1][2:].isdigit():
        split["num_clients"] = int(words.pop()[2:])
    shifted = False
    if words and feature_shift_from_word(words[-1]) is not None:
        split.update(feature_shift_from_word(words.pop()))
        shifted = True
    if words and words[-1].startswith("lg") and words[-1][2:].isdigit():
        split["label_groups"] = int(words.pop()[2:])
        shifted = True
    token = "-".join(words)
    if not token and shifted:  # e.g. Digits-rot4: the generator's default partition, shifted
        split.setdefault("partition", "dir")
    for scheme, key in (("exdir", "alpha"), ("dir", "alpha"), ("pat", "class_per_client"), ("iid", None)):
        if token.startswith(scheme):
            value = token[len(scheme):]
            if key is None and not value:
                split.update(non_iid=False, partition="iid")
            elif key == "alpha" and _is_number(value):
                split.update(partition=scheme, alpha=float(value))
            elif key == "class_per_client" and value.isdigit():
                split.update(partition=scheme, class_per_client=int(value))
            break
    return split


def feature_shift_flags(split: Mapping) -> list:
    """The generator flags of the feature shift a config (or a split read off a name) records."""
    groups = split.get("feature_groups", 1)
    if groups == 1:
        return []
    words = ["--feature-groups", str(groups)]
    if split.get("feature_shift") != CORRUPTION:
        return words
    words += ["--feature-shift", CORRUPTION]
    severity = split.get("corruption_severity", DEFAULT_SEVERITY)
    if severity != DEFAULT_SEVERITY:
        words += ["--severity", str(severity)]
    corruptions = split.get("corruptions")
    if corruptions and corruptions != ",".join(DEFAULT_CORRUPTIONS[:groups]):
        words += ["--corruptions", str(corruptions)]
    return words


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def digits_generator():
    """The embedded dataset's generator module (its default split and folder names)."""
    import dataset.generate_Digits as digits
    return digits
