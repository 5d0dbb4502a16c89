"""Partition AG News (news topics: World, Sports, Business, Sci/Tech) into per-client token files.

The public CSV release has 120,000 train and 7,600 test rows of ``class index (1-4), title,
description``. Title and description are joined, tokenised and encoded as in ``dataset/utils/text.py``
(vocabulary from the train rows only, ``--vocab-size`` ids with 0 = padding and 1 = unknown, every text
cut or padded to ``--max-len`` tokens); then both splits are pooled and partitioned like the image
datasets. Usage (PFLlib's argv, plus named options; see --help)::

    python dataset/generate_AGNews.py noniid - dir --alpha 0.1                    # downloads the CSVs
    python dataset/generate_AGNews.py noniid - dir --source ag_news_csv/           # train.csv + test.csv
    python dataset/generate_AGNews.py noniid - dir --source rows.csv               # one CSV of your own
    python dataset/generate_AGNews.py noniid - dir --source tokens.npz             # ids x (N, L), labels y
    python system/main.py -data AGNews -m TextCNN                                 # -vs: the dataset's
"""
import csv
import hashlib
import sys
import urllib.request
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from dataset.utils.client_files import DatasetFileError  # noqa: E402
from dataset.utils.generate import DownloadError, GeneratorSetting, removed_on_failure  # noqa: E402
from dataset.utils.generate import main as generate_main  # noqa: E402
from dataset.utils.text import encode_texts, load_token_npz  # noqa: E402

# The release torchtext downloads, with its checksums.
URLS = {
    "train": "https://raw.githubusercontent.com/mhjabreel/CharCnn_Keras/master/data/ag_news_csv/train.csv",
    "test": "https://raw.githubusercontent.com/mhjabreel/CharCnn_Keras/master/data/ag_news_csv/test.csv",
}
MD5 = {"train": "b1a00f826fdfbd249f79597b59e1dc12", "test": "d52ea96a97a2d943681189a97654912d"}
CLASSES = ("World", "Sports", "Business", "Sci/Tech")  # class index 1..4 in the CSV, labels 0..3 here

SETTINGS = (
    GeneratorSetting("--vocab-size", 32000, "token ids in all, 0 (padding) and 1 (unknown) included; the "
                                            "train text's most frequent tokens get the rest (PFLlib: 32000)",
                     minimum=3),
    GeneratorSetting("--max-len", 200, "tokens per text: longer texts are cut, shorter ones padded with 0"),
)
SOURCE_HELP = ("build offline from a local copy: the release's folder (train.csv and test.csv), one CSV of "
               "rows 'class index (1-4), title, description' (its rows build the vocabulary), or a .npz of "
               "token ids x (N x L, 0 = padding) and labels y")


def read_rows(path: Path):
    """``(texts, labels)`` of an AG News CSV: title and description joined, class index 1..4 -> 0..3."""
    texts, labels = [], []
    with open(path, encoding="utf-8", errors="replace", newline="") as fh:
        for line, row in enumerate(csv.reader(fh), start=1):
            if not row:
                continue
            if len(row) < 3 or not row[0].strip().isdigit() or not 1 <= int(row[0]) <= len(CLASSES):
                raise DatasetFileError(f"{path}, row {line}: expected 'class index (1-{len(CLASSES)}), title, "
                                       f"description', got {str(row)[:80]}")
            labels.append(int(row[0]) - 1)
            texts.append(" ".join(row[1:]))
    if not texts:
        raise DatasetFileError(f"{path} holds no rows")
    return texts, np.asarray(labels, dtype=np.int64)


def from_csv_files(train_csv: Path, test_csv: Optional[Path] = None, *, vocab_size: int, max_len: int):
    """Token ids of the train rows then the test rows, their labels, and the config entries."""
    train_texts, train_labels = read_rows(train_csv)
    test_texts, test_labels = read_rows(test_csv) if test_csv is not None else ([], np.zeros(0, np.int64))
    x, inputs = encode_texts(train_texts, test_texts, vocab_size, max_len)
    return x, np.concatenate([train_labels, test_labels]), inputs


def md5_of(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_release(raw_dir: Path) -> Path:
    """``raw_dir`` holding the verified train.csv and test.csv (files already there are reused).

    A failed download removes what it wrote and says how to build offline."""
    raw_dir = Path(raw_dir)
    try:
        with removed_on_failure(raw_dir):
            raw_dir.mkdir(parents=True, exist_ok=True)
            for split, url in URLS.items():
                target = raw_dir / f"{split}.csv"
                if target.is_file() and md5_of(target) == MD5[split]:
                    continue
                partial = target.with_suffix(".part")
                urllib.request.urlretrieve(url, partial)
                if md5_of(partial) != MD5[split]:
                    raise DownloadError(f"{url} did not match its published checksum; pass --source to {SOURCE_HELP}")
                partial.replace(target)
    except OSError as err:
        reason = " ".join(str(getattr(err, "reason", None) or err).split())[:200]
        raise DownloadError(f"could not download AG News ({reason}); pass --source to {SOURCE_HELP}") from None
    return raw_dir


def load_raw(source, raw_dir, *, vocab_size: int, max_len: int):
    if source is None:
        source = download_release(raw_dir)
    source = Path(source)
    if source.is_dir():
        missing = [name for name in ("train.csv", "test.csv") if not (source / name).is_file()]
        if missing:
            raise FileNotFoundError(f"--source folder {source} lacks {' and '.join(missing)}")
        return from_csv_files(source / "train.csv", source / "test.csv", vocab_size=vocab_size, max_len=max_len)
    if not source.is_file():
        raise FileNotFoundError(f"--source file {source} does not exist")
    if source.suffix == ".npz":
        return load_token_npz(source, vocab_size, max_len)
    return from_csv_files(source, vocab_size=vocab_size, max_len=max_len)


def main(argv) -> int:
    return generate_main("AGNews", load_raw, argv, settings=SETTINGS, source_help=SOURCE_HELP)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
