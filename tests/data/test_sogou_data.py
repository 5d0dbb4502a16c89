"""Sogou News end to end: the CSV release (``sogou_news_csv.tgz``) -> token files -> text models under LAG.

Everything runs on a small synthetic release written here: pinyin rows of five topics in the release's
quoted CSV form, packed as the release packs them (``sogou_news_csv/{train,test,classes,readme}``);
nothing is downloaded: the download is replaced by a copy of that archive, or by a failure.
"""
import csv
import json
import random
import shutil
import tarfile

import h5py
import numpy as np
import pytest

import main
from helpers import serve_a_broken_download
from dataset import generate_SogouNews
from dataset.utils import release
from dataset.utils.client_files import TOKEN_INPUTS, read_client_arrays
from dataset.utils.text import encode_texts
from dataset.utils.topic_csv import from_csv_files, read_rows

CLIENTS, MAX_LEN, VOCAB_CAP = 4, 16, 60
TOPIC_WORDS = {1: ["zu2", "qiu2", "bi3", "sai4"], 2: ["gu3", "piao4", "yin2", "hang2"],
               3: ["dian4", "ying3", "ming2", "xing1"], 4: ["qi4", "che1", "jia4", "shi3"],
               5: ["shou3", "ji1", "ruan3", "jian4"]}
COMMON_WORDS = ["de", "le", "zhong1", "guo2", "xin1", "wen2", "ji4", "zhe3"]
LONG_ROW = 7  # this train row's content is longer than csv's default field limit (128 KiB)


def write_rows(path, rows, seed):
    """Rows of the release's form, every field quoted: class index 1-5, title, content (pinyin)."""
    rng = random.Random(seed)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, quoting=csv.QUOTE_ALL)
        for i in range(rows):
            topic = i % 5 + 1
            title = " ".join(rng.choice(TOPIC_WORDS[topic]) for _ in range(3))
            words = [rng.choice(TOPIC_WORDS[topic] + COMMON_WORDS) for _ in range(rng.randint(3, 30))]
            if seed == 0 and i == LONG_ROW:
                words *= 1 + 140_000 // len(" ".join(words))
            writer.writerow([topic, title, " ".join(words) + f" hao4{i}"])  # hao4<i>: a rare word per row
    return path


def write_release(folder, train_rows=250, test_rows=50):
    """``folder``/sogou_news_csv/ with the release's four files, and the .tgz packing them."""
    top = folder / "sogou_news_csv"
    top.mkdir(parents=True)
    write_rows(top / "train.csv", train_rows, seed=0)
    write_rows(top / "test.csv", test_rows, seed=1)
    (top / "classes.txt").write_text("\n".join(generate_SogouNews.CLASSES) + "\n")
    (top / "readme.txt").write_text("Sogou News Topic Classification Dataset\n")
    return top, pack(top, folder / "sogou_news_csv.tgz")


def pack(top, archive, skip=()):
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(top.iterdir()):
            if path.name not in skip:
                tar.add(path, f"{top.name}/{path.name}")
    return archive


def generate(data_root, source, *extra):
    argv = ["noniid", "-", "dir", "--alpha", "1", "--num-clients", str(CLIENTS), "--max-len", str(MAX_LEN),
            "--vocab-size", str(VOCAB_CAP), "--root", str(data_root),
            *(["--source", str(source)] if source is not None else []), *extra]
    return generate_SogouNews.main(argv)


@pytest.fixture(scope="module")
def sogou(tmp_path_factory):
    """(data root holding SogouNews built from the .tgz, the release's folder, the .tgz)."""
    root = tmp_path_factory.mktemp("sogou")
    top, archive = write_release(root / "release")
    assert generate(root / "data", archive) == 0
    return root / "data", top, archive


def read_config(folder):
    return json.loads((folder / "config.json").read_text())


# ----- reading and encoding the release -----------------------------------------------------------------
def test_rows_join_title_and_content_and_a_field_past_the_csv_limit_is_read_whole(sogou):
    path = sogou[1] / "train.csv"
    limit = csv.field_size_limit()
    rows = list(read_rows(path, generate_SogouNews.RELEASE))
    assert csv.field_size_limit() == limit  # raised while reading only
    assert len(rows) == 250 and {label for _, label in rows} == {0, 1, 2, 3, 4}
    with open(path, newline="", encoding="utf-8") as fh:
        first = next(csv.reader(fh))
    assert rows[0] == (f"{first[1]} {first[2]}", int(first[0]) - 1)
    assert len(rows[LONG_ROW][0]) > limit and rows[LONG_ROW][0].endswith(f"hao4{LONG_ROW}")


def test_encoding_in_two_passes_equals_encoding_all_texts_at_once(sogou):
    """The streamed encoding gives exactly what text.encode_texts gives on every text held in memory."""
    top = sogou[1]
    x, y, inputs = from_csv_files(generate_SogouNews.RELEASE, top / "train.csv", top / "test.csv",
                                  vocab_size=VOCAB_CAP, max_len=MAX_LEN)
    train, test = (list(read_rows(top / name, generate_SogouNews.RELEASE)) for name in ("train.csv", "test.csv"))
    expected_x, expected_inputs = encode_texts([t for t, _ in train], [t for t, _ in test], VOCAB_CAP, MAX_LEN)
    assert np.array_equal(x, expected_x) and inputs == expected_inputs
    assert y.tolist() == [label for _, label in train + test]


# ----- the generator's files ----------------------------------------------------------------------------
def test_the_archive_gives_token_files_of_every_row_once(sogou):
    data, top, _ = sogou
    folder = data / "SogouNews"
    config = read_config(folder)
    assert config["input_kind"] == TOKEN_INPUTS and config["input_shape"] == [MAX_LEN]
    assert config["num_classes"] == 5 and config["num_clients"] == CLIENTS and config["vocab_size"] == VOCAB_CAP
    assert config["generator_settings"] == {"vocab_size": VOCAB_CAP, "max_len": MAX_LEN}
    assert sorted(p.name for p in (folder / "rawdata").iterdir()) == ["test.csv", "train.csv"]  # extracted
    x_all, y_all, _ = from_csv_files(generate_SogouNews.RELEASE, top / "train.csv", top / "test.csv",
                                     vocab_size=VOCAB_CAP, max_len=MAX_LEN)
    written, labels = [], set()
    for split in ("train", "test"):
        for i in range(CLIENTS):
            x, y = read_client_arrays(folder / split / f"{i}.npz")
            assert x.dtype == np.int64 and x.shape == (len(y), MAX_LEN) and len(y) == config[f"{split}_samples"][i]
            written += [row.tobytes() + bytes([label]) for row, label in zip(x, y)]
            labels |= set(y.tolist())
    assert sorted(written) == sorted(row.tobytes() + bytes([label]) for row, label in zip(x_all, y_all))
    assert labels == {0, 1, 2, 3, 4} and len(written) == 300


def test_the_folder_and_one_csv_are_sources_too(sogou, tmp_path):
    data, top, _ = sogou
    assert generate(tmp_path, top) == 0
    assert read_config(tmp_path / "SogouNews")["content_sha256"] == read_config(data / "SogouNews")["content_sha256"]
    assert generate(tmp_path / "one", top / "test.csv") == 0
    config = read_config(tmp_path / "one" / "SogouNews")
    assert sum(config["train_samples"]) + sum(config["test_samples"]) == 50


@pytest.mark.parametrize("what, message", [
    ("no test.csv", "sogou_news_csv.tgz lacks test.csv; expected the release's sogou_news_csv.tgz"),
    ("not an archive", "sogou_news_csv.tgz is not a readable .tgz archive"),
    ("bad row", "train.csv, row 3: expected 'class index (1-5), title, content', got ['6',"),
])
def test_a_malformed_source_is_refused_in_one_line(sogou, tmp_path, capsys, what, message):
    top = shutil.copytree(sogou[1], tmp_path / "sogou_news_csv")
    archive = tmp_path / "sogou_news_csv.tgz"
    if what == "no test.csv":
        pack(top, archive, skip=("test.csv",))
    elif what == "not an archive":
        archive.write_bytes(b"\x1f\x8b\x08 not really gzip")
    else:
        (top / "train.csv").write_text('"1","a","b"\n"2","c","d"\n"6","e","f"\n')
        archive = top / "train.csv"
    assert generate(tmp_path / "data", archive) == 2
    out = capsys.readouterr().out
    assert out.startswith("error: ") and len(out.splitlines()) == 1 and message in out, out
    assert not (tmp_path / "data" / "SogouNews" / "config.json").exists()


# ----- the download path --------------------------------------------------------------------------------
def test_without_source_the_archive_is_downloaded_extracted_and_removed(sogou, tmp_path, monkeypatch):
    calls = []

    def retrieve(url, filename):
        calls.append(url)
        shutil.copyfile(sogou[2], filename)
    monkeypatch.setattr(release.urllib.request, "urlretrieve", retrieve)
    assert generate(tmp_path, None) == 0
    assert calls == [generate_SogouNews.URL]
    assert sorted(p.name for p in (tmp_path / "SogouNews" / "rawdata").iterdir()) == ["test.csv", "train.csv"]
    built_before = read_config(sogou[0] / "SogouNews")["content_sha256"]
    assert read_config(tmp_path / "SogouNews")["content_sha256"] == built_before
    assert generate(tmp_path, None, "--force") == 0 and len(calls) == 1  # the extracted CSVs are reused


@pytest.mark.parametrize("failure, message", [
    ("network", "could not download Sogou News ([Errno 111] Connection refused); pass --source"),
    ("not the release", "gave a file that is not a .tgz archive holding train.csv and test.csv; pass --source"),
])
def test_a_failed_download_names_source_and_leaves_nothing(tmp_path, monkeypatch, capsys, failure, message):
    serve_a_broken_download(monkeypatch, b"<Error><Code>AccessDenied</Code></Error>", refuse=failure == "network")
    assert generate(tmp_path, None) == 2
    out = capsys.readouterr().out
    assert out.startswith("error: ") and message in out, out
    assert not (tmp_path / "SogouNews").exists()


# ----- training runs ------------------------------------------------------------------------------------
def train(data, results, dataset, model, algorithm, *extra):
    """Two rounds (-gr 1) in-process; returns the .h5's test accuracies, LAG layer names and run config."""
    flags = ["-algo", algorithm, "-data", dataset, "-m", model, "-gr", "1", "-dev", "cpu", "-lr", "0.1", "-lbs", "64",
             "--data_dir", str(data), "--results_dir", str(results), "--threads", "1", *extra]
    assert main.main(flags) == 0
    with h5py.File(results / f"{dataset}_{algorithm}_test_0.h5", "r") as f:
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in f["lag_layer_names"][()]]
        return f["rs_test_acc"][()], names, json.loads(f.attrs["config"])


@pytest.mark.parametrize("algorithm", ["FedLAG", "FedRep+LAG"])
def test_textcnn_trains_on_sogou_under_lag(sogou, tmp_path, algorithm):
    accuracy, names, config = train(sogou[0], tmp_path, "SogouNews", "TextCNN", algorithm, "-nc", str(CLIENTS))
    assert len(accuracy) == 2 and np.isfinite(accuracy).all()
    assert config["vocab_size"] == VOCAB_CAP  # -vs left out: the dataset's vocabulary
    assert names and all(name.startswith("base.") for name in names if name != "head")
    assert ("head" in names) == (algorithm == "FedLAG")  # FedRep keeps its head personal: LAG ranks the base
    assert any("embedding" in name for name in names), names  # the embedding is a layer LAG scores


def test_an_lstm_trains_on_sogou(sogou, tmp_path):
    """On 4-token texts and two clients: an LSTM of PFLlib's width is the slowest model to train here."""
    data, _, archive = sogou
    assert generate(data, archive, "--max-len", "4", "--num-clients", "2", "--name", "SogouNews-ml4") == 0
    accuracy, names, config = train(data, tmp_path, "SogouNews-ml4", "LSTM", "FedLAG", "-nc", "2")
    assert len(accuracy) == 2 and np.isfinite(accuracy).all() and config["vocab_size"] == VOCAB_CAP
    assert "base.lstm" in names and names[-1] == "head", names
