"""Digit5: feature shift over five digit domains (MNIST, MNIST-M, SVHN, SynthDigits, USPS), as PFLlib's.

Every image is resized to 32x32 RGB (bilinear; grey digits get their channel three times), PFLlib's
common size, and each domain's train and test images are pooled. Each client holds one domain only:
client ``i`` belongs to domain ``i % 5`` in the order above (``client_domains`` in config.json), and a
domain's samples are split among its clients by the usual label partition, IID by default. With
``--num-clients 5`` that is PFLlib's split, one client per domain; the default 20 gives each domain four::

    python dataset/generate_Digit5.py --source digit5/                        # iid, 20 clients
    python dataset/generate_Digit5.py noniid - dir --alpha 0.5 --source digit5/
    python system/main.py -data Digit5 -m CNN

``--source`` is a folder holding one ``.npz`` per domain: ``mnist.npz``, ``mnistm.npz``, ``svhn.npz``,
``syn.npz`` and ``usps.npz``, each with uint8 images ``x`` (N x H x W, or N x H x W x 3, any size) and
labels ``y`` (the digits 0-9). A domain the folder lacks is downloaded with torchvision where it has it
(MNIST, SVHN, USPS); MNIST-M and SynthDigits must be in the folder. ``--domain-samples N`` keeps a
seeded random N samples of each larger domain (PFLlib keeps at most 25,000 train and 9,000 test images
of each, and repeats USPS's training images four times); 0, the default, keeps every sample.
"""
import sys
from functools import partial
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from dataset.utils.client_files import DatasetFileError  # noqa: E402
from dataset.utils.command_line import (GENERATOR_ERRORS, error_line, options_from_args, output_folder,  # noqa: E402
                                        parse_args, setting_values)
from dataset.utils.domains import client_domains, partition_by_domain  # noqa: E402
from dataset.utils.generate import (GenerateError, GeneratorSetting, PartitionOptions,  # noqa: E402
                                    already_built, build_dataset)
from dataset.utils.images import RGB, float_images, resize_images  # noqa: E402
from dataset.utils.source_arrays import check_images, read_image_npz  # noqa: E402
from dataset.utils.raw_data import DownloadError  # noqa: E402
from dataset.utils.source_identity import source_digest  # noqa: E402
from dataset.utils.torchvision_splits import download_splits, pooled, torchvision_datasets  # noqa: E402

NAME = "Digit5"
SIZE = 32
NUM_CLASSES = 10
DOMAINS = ("mnist", "mnistm", "svhn", "syn", "usps")
TITLES = {"mnist": "MNIST", "mnistm": "MNIST-M", "svhn": "SVHN", "syn": "SynthDigits", "usps": "USPS"}
DEFAULTS = PartitionOptions(non_iid=False, partition="iid")
SETTINGS = (GeneratorSetting("--domain-samples", 0, "keep a seeded random N samples of each larger domain "
                                                    "(0: every sample)", minimum=0),)
FOLDER_FORM = ("a folder holding one .npz per domain (mnist.npz, mnistm.npz, svhn.npz, syn.npz, usps.npz), "
               "each with uint8 images x (N x H x W [x 3]) and digit labels y")
SOURCE_HELP = f"{FOLDER_FORM}; a domain it lacks is downloaded where torchvision has it (MNIST, SVHN, USPS)"
# Without torchvision, every domain must come from the --source folder.
OFFLINE_HINT = "or put mnist.npz, svhn.npz and usps.npz in the --source folder, which then needs no torchvision"

# The --domain-samples draw has its own random stream: the partition does not depend on it.
SUBSAMPLE_STREAM = 0xD5

Domain = Tuple[np.ndarray, np.ndarray]  # uint8 N x 32 x 32 x 3, int64 labels


def open_train_test(class_name: str, root: str, train: bool):
    """A torchvision digit set with ``train=`` splits and ``data`` / ``targets`` (MNIST, USPS)."""
    digits = getattr(torchvision_datasets(OFFLINE_HINT), class_name)(root, train=train, download=True)
    return np.asarray(digits.data), np.asarray(digits.targets)


def open_svhn(root: str, train: bool):
    """torchvision's SVHN (``split=``, channel-first ``data``, ``labels`` with 10 already mapped to 0)."""
    digits = torchvision_datasets(OFFLINE_HINT).SVHN(root, split="train" if train else "test", download=True)
    return np.asarray(digits.data).transpose(0, 2, 3, 1), np.asarray(digits.labels)


DOWNLOADS = {"mnist": partial(open_train_test, "MNIST"), "svhn": open_svhn, "usps": partial(open_train_test, "USPS")}


def with_iid_default(argv: Sequence[str]) -> list:
    """PFLlib's positional argv with ``iid - -`` when none is given: Digit5's split is IID by default."""
    argv = list(argv)
    given = argv and (not argv[0].startswith("-") or argv[0] == "-")
    return argv if given else ["iid", "-", "-", *argv]


def domain_files(source: Optional[Path]) -> Dict[str, Path]:
    """The domains' files in the ``--source`` folder (none without ``--source``)."""
    if source is None:
        return {}
    source = Path(source)
    if not source.is_dir():
        if source.exists():
            raise GenerateError(f"--source {source} is a file; Digit5's --source is {FOLDER_FORM}")
        raise FileNotFoundError(f"--source folder {source} does not exist")
    return {domain: source / f"{domain}.npz" for domain in DOMAINS if (source / f"{domain}.npz").is_file()}


def load_domain(domain: str, files: Dict[str, Path], raw_dir: Path) -> Domain:
    """One domain at 32x32 RGB: from its file in ``--source``, else downloaded."""
    if domain in files:
        x, y = read_image_npz(files[domain])
        where = str(files[domain])
    else:
        hint = f"pass --source, {FOLDER_FORM} (put {domain}.npz there to skip this download)"
        x, y = check_images(*pooled(download_splits(TITLES[domain], DOWNLOADS[domain], raw_dir, hint)), TITLES[domain])
        where = TITLES[domain]
    if y.max() >= NUM_CLASSES:
        raise DatasetFileError(f"{where}: labels must be the digits 0-9; found {int(y.max())}")
    return resize_images(x, SIZE, RGB), y


def load_domains(source: Optional[Path], raw_dir: Path, domain_samples: int, seed: int) -> Dict[str, Domain]:
    """Every domain in :data:`DOMAINS` order, each cut to ``domain_samples`` (0: all) if larger."""
    files = domain_files(source)
    missing = [domain for domain in DOMAINS if domain not in files and domain not in DOWNLOADS]
    if missing:
        raise DownloadError(f"{' and '.join(TITLES[d] for d in missing)} have no download: pass --source, "
                            f"a folder holding {' and '.join(f'{d}.npz' for d in missing)} (uint8 images x, N x H "
                            f"x W [x 3], digit labels y); of {', '.join(TITLES[d] for d in DOWNLOADS)}, those it "
                            f"lacks are downloaded")
    rng = np.random.default_rng([seed, SUBSAMPLE_STREAM])
    domains = {}
    for domain in DOMAINS:
        x, y = load_domain(domain, files, raw_dir)
        if domain_samples and len(y) > domain_samples:
            keep = np.sort(rng.choice(len(y), domain_samples, replace=False))
            x, y = x[keep], y[keep]
        domains[domain] = (x, y)
    return domains


def main(argv: Sequence[str]) -> int:
    args = parse_args(with_iid_default(argv), NAME, DEFAULTS.class_per_client, None, defaults=DEFAULTS,
                      settings=SETTINGS, source_help=SOURCE_HELP)
    try:
        options = options_from_args(args)
        values = setting_values(args, SETTINGS)
        owners = client_domains(options.num_clients, DOMAINS)
        out = output_folder(args.root, args.name or NAME)
        # Without --source the folder is compared before any download; with it, by the domains' arrays.
        if args.source is None and not args.force and already_built(out, options, values):
            return 0
        domains = load_domains(args.source, Path(args.root) / NAME / "rawdata", values["domain_samples"],
                               options.seed)
        y = np.concatenate([labels for _, labels in domains.values()])
        x = float_images(np.concatenate([images for images, _ in domains.values()]))
        origin = source_digest(args.source, x, y)
        if args.source is not None and not args.force and already_built(out, options, values, origin):
            return 0
        parts = partition_by_domain(y, {d: len(labels) for d, (_, labels) in domains.items()}, options,
                                    NUM_CLASSES, np.random.default_rng(options.seed))
        config = build_dataset(out, x, y, options, source=NAME, num_classes=NUM_CLASSES, parts=parts,
                               extra_config={"client_domains": owners, "generator_settings": values},
                               origin=origin)
    except GENERATOR_ERRORS as err:
        print(error_line(err))
        return 2
    sizes = ", ".join(f"{TITLES[d]} {len(labels)}" for d, (_, labels) in domains.items())
    print(f"wrote {config['num_clients']} clients to {out} ({sum(config['train_samples'])} train / "
          f"{sum(config['test_samples'])} test samples; {sizes})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
