"""Partition Sogou News (news topics: sports, finance, entertainment, automobile, technology) into
per-client token files.

The public CSV release (``sogou_news_csv.tgz``, Zhang et al. 2015) has 450,000 train and 60,000 test
rows of ``class index (1-5), title, content``, the Chinese text romanised as pinyin with tone digits
(``zhong1 guo2``): each syllable is one token. Title and content are joined and encoded as in
``dataset/utils/text.py`` (vocabulary from the train rows only, ``--vocab-size`` ids with 0 = padding and
1 = unknown, every text cut or padded to ``--max-len`` tokens); then both splits are pooled and
partitioned like the image datasets, as AG News is (``dataset/utils/topic_csv.py`` reads both). Usage
(PFLlib's argv, plus named options; see --help)::

    python dataset/generate_SogouNews.py noniid - dir --alpha 0.1                  # downloads the archive
    python dataset/generate_SogouNews.py noniid - dir --source sogou_news_csv.tgz  # the archive itself
    python dataset/generate_SogouNews.py noniid - dir --source sogou_news_csv/     # train.csv + test.csv
    python dataset/generate_SogouNews.py noniid - dir --source rows.csv            # one CSV of your own
    python dataset/generate_SogouNews.py noniid - dir --source tokens.npz          # ids x (N, L), labels y
    python system/main.py -data SogouNews -m TextCNN                              # -vs: the dataset's

No checksum of the archive is published: a download counts as complete when it opens as a tar archive
holding ``train.csv`` and ``test.csv``. Those two are extracted into ``<root>/SogouNews/rawdata/`` (as
they are from a ``--source`` archive, since the train rows are read twice: once for the vocabulary,
once to encode them), and the downloaded archive is then removed; the CSVs are reused by the next build.
"""
import gzip
import shutil
import sys
import tarfile
import zlib
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Dict, Iterator, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataset.utils.client_files import DatasetFileError  # noqa: E402
from dataset.utils.command_line import main as generate_main  # noqa: E402
from dataset.utils.raw_data import removed_on_failure  # noqa: E402
from dataset.utils.release import downloading, fetch  # noqa: E402
from dataset.utils.topic_csv import SPLIT_FILES, TEXT_SETTINGS, TopicCsv, load_source  # noqa: E402

URL = "https://s3.amazonaws.com/fast-ai-nlp/sogou_news_csv.tgz"
ARCHIVE = "sogou_news_csv.tgz"
ARCHIVE_SUFFIXES = (".tgz", ".tar.gz", ".tar")
CLASSES = ("sports", "finance", "entertainment", "automobile", "technology")  # class index 1..5, labels 0..4
RELEASE = TopicCsv(CLASSES, "title, content")

SOURCE_HELP = (f"build offline from a local copy: the release's {ARCHIVE}, its extracted folder (train.csv and "
               f"test.csv), one CSV of rows '{RELEASE.row_form}' (its rows build the vocabulary), or a .npz of "
               "token ids x (N x L, 0 = padding) and labels y")

# What a damaged or foreign archive raises while it is read (a disk error while writing is not one).
_ARCHIVE_ERRORS = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile)


@contextmanager
def csv_members(archive: Path) -> Iterator[Tuple[tarfile.TarFile, Dict[str, tarfile.TarInfo]]]:
    """The open archive and its ``train.csv`` and ``test.csv`` members (in any folder of it). An archive
    that cannot be read, now or while its members are, or that lacks one of them, raises
    :class:`DatasetFileError`."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = {PurePosixPath(m.name).name: m for m in tar.getmembers()
                       if m.isfile() and PurePosixPath(m.name).name in SPLIT_FILES}
            missing = [name for name in SPLIT_FILES if name not in members]
            if missing:
                raise DatasetFileError(f"{archive} lacks {' and '.join(missing)}; expected the release's {ARCHIVE}")
            yield tar, members
    except _ARCHIVE_ERRORS as err:
        reason = " ".join(str(err).split())[:200]  # tarfile lists each compression it tried, one a line
        raise DatasetFileError(f"{archive} is not a readable .tgz archive ({reason}); expected the release's "
                               f"{ARCHIVE}") from None


def archive_problem(path: Path) -> Optional[str]:
    """Whether a download is the release: no checksum is published, so it must open and hold both CSVs."""
    try:
        with csv_members(path):
            return None
    except DatasetFileError:
        return f"gave a file that is not a .tgz archive holding {' and '.join(SPLIT_FILES)}"


def extract_csvs(archive: Path, raw_dir: Path) -> Path:
    """``raw_dir`` holding the archive's train.csv and test.csv, each written under a temporary name and
    renamed when complete; on failure, what was written is removed."""
    raw_dir = Path(raw_dir)
    with removed_on_failure(raw_dir):
        raw_dir.mkdir(parents=True, exist_ok=True)
        with csv_members(archive) as (tar, members):
            for name, member in members.items():
                partial = raw_dir / f"{name}.part"
                with tar.extractfile(member) as src, open(partial, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                partial.replace(raw_dir / name)
    return raw_dir


def download_release(raw_dir: Path) -> Path:
    """``raw_dir`` holding train.csv and test.csv: reused when both are there, else downloaded and
    extracted. A failed download removes what it wrote and says how to build offline."""
    raw_dir = Path(raw_dir)
    if all((raw_dir / name).is_file() for name in SPLIT_FILES):
        return raw_dir
    with downloading("Sogou News", raw_dir, SOURCE_HELP) as folder:
        archive = fetch(URL, folder / ARCHIVE, archive_problem, SOURCE_HELP)
        extract_csvs(archive, folder)
        archive.unlink()
    return folder


def load_raw(source, raw_dir, *, vocab_size: int, max_len: int):
    if source is None:
        source = download_release(raw_dir)
    elif Path(source).is_file() and Path(source).name.endswith(ARCHIVE_SUFFIXES):
        source = extract_csvs(Path(source), raw_dir)
    return load_source(RELEASE, source, vocab_size=vocab_size, max_len=max_len)


def main(argv) -> int:
    return generate_main("SogouNews", load_raw, argv, settings=TEXT_SETTINGS, source_help=SOURCE_HELP,
                         inputs="texts")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
