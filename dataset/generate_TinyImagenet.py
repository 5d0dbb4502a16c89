"""Partition Tiny ImageNet (200 ImageNet classes, 64x64 RGB) into per-client files.

The public release (http://cs231n.stanford.edu/tiny-imagenet-200.zip, 248 MB) holds ``wnids.txt`` (the
200 WordNet ids), 500 training images per class under ``train/<wnid>/images/`` and 10,000 validation
images under ``val/images/``, labelled by ``val/val_annotations.txt`` (its test images have no labels
and are left out). Train and val images are pooled, 110,000 in all, and partitioned like CIFAR (default
Dirichlet(0.1) over 20 clients; ``pat`` gives 20 classes per client, as PFLlib's generator does). Labels
are the wnids in sorted order, the class order of PFLlib's ``ImageFolder``; PFLlib reads ``val/`` as
an image folder too, which gives all 10,000 validation images one label, while here they get their
annotated ones. ``config.json`` records the wnids (``class_wnids``)::

    python dataset/generate_TinyImagenet.py noniid - dir --alpha 0.1      # downloads the zip
    python dataset/generate_TinyImagenet.py noniid - pat --source tiny-imagenet-200.zip
    python system/main.py -data TinyImagenet -m ResNet18

The download is read in place: images are decoded one at a time from the zip (nothing is extracted and
the archive is never held in memory). ``--source`` may also be the extracted folder, or a ``.npz`` of
uint8 images ``x`` (N x 64 x 64 x 3; another size is resized) and labels ``y``. The few grey JPEGs of
the release become RGB. As floats the dataset takes 5.4 GB of memory while it is written.
"""
import hashlib
import io
import sys
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from dataset.utils.client_files import DatasetFileError  # noqa: E402
from dataset.utils.command_line import main as generate_main  # noqa: E402
from dataset.utils.images import RGB, float_images, image_array, resize_images  # noqa: E402
from dataset.utils.source_arrays import read_image_npz  # noqa: E402
from dataset.utils.release import downloading, fetch  # noqa: E402

NAME = "TinyImagenet"
URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
ZIP_MD5 = "90528d7ca1a48142e341f4ef8d21d0de"
SIZE = 64
MARKER = "wnids.txt"
ANNOTATIONS = "val/val_annotations.txt"
IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
LAYOUT = ("Tiny ImageNet's layout: wnids.txt, train/<wnid>/images/*.JPEG, val/images/ and "
          "val/val_annotations.txt")
SOURCE_HELP = ("build offline from a local copy: tiny-imagenet-200.zip, the folder it extracts to "
               "(wnids.txt, train/, val/), or a .npz of uint8 images x (N x 64 x 64 x 3) and labels y")

# The release's files by their path below its top folder, and how to open one (binary).
Release = Tuple[List[str], Callable[[str], BinaryIO]]


def md5_problem(path: Path) -> Optional[str]:
    """None when ``path`` is the published zip, else what is wrong (a check for ``release.fetch``)."""
    digest = hashlib.md5()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return None if digest.hexdigest() == ZIP_MD5 else "did not match its published checksum"


def download_zip(raw_dir: Path) -> Path:
    """``raw_dir/tiny-imagenet-200.zip``, downloaded unless the checked zip is already there."""
    with downloading("Tiny ImageNet", raw_dir, SOURCE_HELP) as folder:
        return fetch(URL, folder / "tiny-imagenet-200.zip", md5_problem, SOURCE_HELP)


@contextmanager
def open_zip(source: Path) -> Iterator[Release]:
    """The release inside a zip (its top folder found by ``wnids.txt``), open for reading members."""
    try:
        archive = zipfile.ZipFile(source)
    except (zipfile.BadZipFile, OSError) as err:
        raise DatasetFileError(f"{source} is not a readable .zip archive ({err}); expected {LAYOUT}") from None
    with archive:
        names = [n for n in archive.namelist() if not n.endswith("/")]
        markers = [n for n in names if n.rsplit("/", 1)[-1] == MARKER and not n.startswith("__MACOSX/")]
        if not markers:
            raise DatasetFileError(f"{source} holds no {MARKER}; expected {LAYOUT}")
        prefix = min(markers, key=len)[:-len(MARKER)]
        yield ([n[len(prefix):] for n in names if n.startswith(prefix)],
               lambda name: archive.open(prefix + name))


@contextmanager
def open_folder(source: Path) -> Iterator[Release]:
    """The release in a folder: ``source`` itself or a folder inside it holding ``wnids.txt``."""
    tops = [source] + sorted(p for p in source.iterdir() if p.is_dir())
    top = next((folder for folder in tops if (folder / MARKER).is_file()), None)
    if top is None:
        raise FileNotFoundError(f"--source folder {source} holds no {MARKER}; expected {LAYOUT}")
    names = [p.relative_to(top).as_posix() for p in top.rglob("*") if p.is_file()]
    yield names, lambda name: open(top / name, "rb")


def labelled_images(names: List[str], read: Callable[[str], bytes], where: Path):
    """(image paths, labels, wnids): every train and val image of the release, train first, with the
    wnids in sorted order numbering the classes."""
    wnids = sorted(set(read(MARKER).decode("utf-8", "replace").split()))
    label_of = {wnid: i for i, wnid in enumerate(wnids)}
    train = sorted(n for n in names if _is_train_image(n))
    if not train or ANNOTATIONS not in names:
        raise DatasetFileError(f"{where} lacks {'train/<wnid>/images/' if not train else ANNOTATIONS}; "
                               f"expected {LAYOUT}")
    paths, labels = [], []
    for name in train:
        paths.append(name)
        labels.append(_label(label_of, name.split("/")[1], where, name))
    present = set(names)
    for line in read(ANNOTATIONS).decode("utf-8", "replace").splitlines():
        fields = line.split()
        if not fields:
            continue
        name = f"val/images/{fields[0]}"
        if len(fields) < 2 or name not in present:
            raise DatasetFileError(f"{where}: {ANNOTATIONS} line {line[:60]!r} does not name an image of "
                                   f"val/images/ and its wnid")
        paths.append(name)
        labels.append(_label(label_of, fields[1], where, ANNOTATIONS))
    return paths, np.asarray(labels, dtype=np.int64), wnids


def _is_train_image(name: str) -> bool:
    parts = name.split("/")
    return (len(parts) == 4 and parts[0] == "train" and parts[2] == "images"
            and parts[3].lower().endswith(IMAGE_SUFFIXES))


def _label(label_of: dict, wnid: str, where: Path, name: str) -> int:
    if wnid not in label_of:
        raise DatasetFileError(f"{where}: {name} names wnid {wnid!r}, which {MARKER} does not list")
    return label_of[wnid]


def decode_images(paths: List[str], open_member: Callable[[str], BinaryIO], where: Path) -> np.ndarray:
    """uint8 N x 64 x 64 x 3, one image decoded at a time."""
    x = np.empty((len(paths), SIZE, SIZE, RGB), dtype=np.uint8)
    for i, name in enumerate(paths):
        try:
            with open_member(name) as member, Image.open(io.BytesIO(member.read())) as image:
                x[i] = image_array(image, SIZE, RGB)
        except (OSError, SyntaxError, ValueError) as err:
            raise DatasetFileError(f"{where}: {name} is not a readable image ({err})") from None
    return x


def read_release(source: Path):
    """(uint8 images, labels, wnids) from the release's zip or extracted folder."""
    with (open_folder(source) if source.is_dir() else open_zip(source)) as (names, open_member):
        def read(name: str) -> bytes:
            with open_member(name) as member:
                return member.read()
        paths, labels, wnids = labelled_images(names, read, source)
        return decode_images(paths, open_member, source), labels, wnids


def load_raw(source, raw_dir):
    source = Path(source) if source is not None else download_zip(raw_dir)
    if not source.exists():
        raise FileNotFoundError(f"--source {source} does not exist")
    if source.suffix == ".npz":
        x, y = read_image_npz(source)
        return float_images(resize_images(x, SIZE, RGB)), y
    x, y, wnids = read_release(source)
    return float_images(x), y, {"class_wnids": wnids}


def main(argv) -> int:
    return generate_main(NAME, load_raw, argv, default_class_per_client=20, source_help=SOURCE_HELP)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
