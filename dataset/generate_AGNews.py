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
import hashlib
import sys
from functools import partial
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataset.utils.command_line import main as generate_main  # noqa: E402
from dataset.utils.release import downloading, fetch  # noqa: E402
from dataset.utils.topic_csv import TEXT_SETTINGS, TopicCsv, load_source  # noqa: E402
from dataset.utils.topic_csv import from_csv_files as topic_csv_files  # noqa: E402

# The release torchtext downloads, with its checksums.
URLS = {
    "train": "https://raw.githubusercontent.com/mhjabreel/CharCnn_Keras/master/data/ag_news_csv/train.csv",
    "test": "https://raw.githubusercontent.com/mhjabreel/CharCnn_Keras/master/data/ag_news_csv/test.csv",
}
MD5 = {"train": "b1a00f826fdfbd249f79597b59e1dc12", "test": "d52ea96a97a2d943681189a97654912d"}
CLASSES = ("World", "Sports", "Business", "Sci/Tech")  # class index 1..4 in the CSV, labels 0..3 here
RELEASE = TopicCsv(CLASSES, "title, description")

SOURCE_HELP = ("build offline from a local copy: the release's folder (train.csv and test.csv), one CSV of "
               f"rows '{RELEASE.row_form}' (its rows build the vocabulary), or a .npz of "
               "token ids x (N x L, 0 = padding) and labels y")

# (train_csv, test_csv=None, *, vocab_size, max_len) -> token ids, labels, config entries
from_csv_files = partial(topic_csv_files, RELEASE)


def md5_of(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def checksum_problem(expected: str, path: Path) -> Optional[str]:
    return None if md5_of(path) == expected else "did not match its published checksum"


def download_release(raw_dir: Path) -> Path:
    """``raw_dir`` holding the verified train.csv and test.csv (files already there are reused).

    A failed download removes what it wrote and says how to build offline."""
    with downloading("AG News", raw_dir, SOURCE_HELP) as folder:
        for split, url in URLS.items():
            fetch(url, folder / f"{split}.csv", partial(checksum_problem, MD5[split]), SOURCE_HELP)
    return folder


def load_raw(source, raw_dir, *, vocab_size: int, max_len: int):
    if source is None:
        source = download_release(raw_dir)
    return load_source(RELEASE, source, vocab_size=vocab_size, max_len=max_len)


def main(argv) -> int:
    return generate_main("AGNews", load_raw, argv, settings=TEXT_SETTINGS, source_help=SOURCE_HELP, inputs="texts")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
