"""Text data end to end: AG News-style CSV -> token files -> loader -> text models under FedAvg and LAG;
and Shakespeare's next-character task with one client per role.

Everything runs on synthetic data written here (a CSV of a few hundred rows, four topics with their own
words; a LEAF-format JSON of four roles); nothing is downloaded.
"""
import csv
import json
import random
import shutil
from pathlib import Path
from urllib.error import URLError

import h5py
import numpy as np
import pytest
import torch

import main
from dataset import generate_AGNews, generate_Shakespeare
from dataset.utils import release
from dataset.generate_AGNews import from_csv_files
from dataset.utils.client_files import TOKEN_INPUTS, read_client_arrays
from dataset.utils.raw_data import DownloadError
from dataset.utils.text import PAD_ID, UNKNOWN_ID, build_vocabulary, encode, tokenize
from utils.client_data import load_client_data
from utils.datasets import DatasetError, dataset_info
CLIENTS, MAX_LEN, VOCAB_CAP = 4, 24, 40
TOPIC_WORDS = {1: ["election", "minister", "treaty"], 2: ["match", "goal", "coach"],
               3: ["stocks", "profit", "bank"], 4: ["software", "chip", "internet"]}
COMMON_WORDS = ["the", "a", "of", "news", "today", "report", "said"]


def write_agnews_csv(path, rows=320, seed=0):
    """Rows of the CSV release's form: class index 1-4, title, description; a topic's words mark its class."""
    rng = random.Random(seed)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        for i in range(rows):
            topic = i % 4 + 1
            title = " ".join(rng.choice(TOPIC_WORDS[topic]) for _ in range(3)).title()
            words = [rng.choice(TOPIC_WORDS[topic] + COMMON_WORDS) for _ in range(rng.randint(4, 40))]
            writer.writerow([topic, title, ", ".join(words) + f" (id{i})."])  # id<i>: a rare word per row
    return path


def generate(data_root, source, *extra):
    argv = ["noniid", "-", "dir", "--alpha", "0.5", "--num-clients", str(CLIENTS), "--max-len", str(MAX_LEN),
            "--vocab-size", str(VOCAB_CAP), "--source", str(source), "--root", str(data_root), *extra]
    return generate_AGNews.main(argv)


@pytest.fixture(scope="module")
def agnews(tmp_path_factory):
    """(data root holding AGNews, the CSV it was built from)."""
    root = tmp_path_factory.mktemp("text")
    source = write_agnews_csv(root / "rows.csv")
    assert generate(root / "data", source) == 0
    return root / "data", source


def client_arrays(folder, split):
    return [read_client_arrays(folder / split / f"{i}.npz") for i in range(CLIENTS)]


# ----- tokeniser and vocabulary ------------------------------------------------------------------------
def test_tokenizer_lower_cases_and_splits_on_everything_but_letters_and_digits():
    assert tokenize("Oil hits $50, Reuters' 3D_chip (UPDATE-2)!") == \
        ["oil", "hits", "50", "reuters", "3d", "chip", "update", "2"]
    assert tokenize("Café Zürich") == ["café", "zürich"]  # letters of any script stay in their word


def test_vocabulary_ranks_by_count_then_alphabetically_whatever_the_text_order():
    texts = [["b", "a", "c", "a", "b"], ["c", "d", "e", "e"]]
    vocabulary = build_vocabulary(texts, vocab_size=6)
    assert vocabulary == {"a": 2, "b": 3, "c": 4, "e": 5}  # four of five tokens fit beside ids 0 and 1
    assert build_vocabulary(texts[::-1], vocab_size=6) == vocabulary
    assert build_vocabulary([t[::-1] for t in texts], vocab_size=6) == vocabulary


def test_encoding_marks_unknown_tokens_cuts_and_pads():
    ids = encode([["a", "zzz", "b"], ["b"] * 5], {"a": 2, "b": 3}, max_len=4)
    assert ids.dtype == np.int64
    assert ids.tolist() == [[2, UNKNOWN_ID, 3, PAD_ID], [3, 3, 3, 3]]


# ----- the generator's files ----------------------------------------------------------------------------
def test_config_records_token_inputs_and_the_generator_settings(agnews):
    data, source = agnews
    config = json.loads((data / "AGNews" / "config.json").read_text())
    _, _, expected = from_csv_files(source, vocab_size=VOCAB_CAP, max_len=MAX_LEN)
    assert config["input_kind"] == TOKEN_INPUTS and config["input_shape"] == [MAX_LEN]
    assert config["max_len"] == MAX_LEN and config["vocab_size"] == expected["vocab_size"] == VOCAB_CAP
    assert config["generator_settings"] == {"vocab_size": VOCAB_CAP, "max_len": MAX_LEN}
    assert config["num_classes"] == 4 and config["num_clients"] == CLIENTS


def test_every_sample_lands_in_exactly_one_client_as_right_padded_int64_ids(agnews):
    data, source = agnews
    folder = data / "AGNews"
    config = json.loads((folder / "config.json").read_text())
    x_all, y_all, _ = from_csv_files(source, vocab_size=VOCAB_CAP, max_len=MAX_LEN)
    written = []
    for split in ("train", "test"):
        for i, (x, y) in enumerate(client_arrays(folder, split)):
            assert x.dtype == np.int64 and x.shape == (len(y), MAX_LEN) and y.dtype == np.int64
            assert x.min() >= 0 and x.max() < config["vocab_size"]
            assert len(y) == config[f"{split}_samples"][i]
            real = x != PAD_ID
            assert (real[:, 0]).all() and not (~real[:, :-1] & real[:, 1:]).any()  # padding only trails
            written += [row.tobytes() + bytes([label]) for row, label in zip(x, y)]
    expected = [row.tobytes() + bytes([label]) for row, label in zip(x_all, y_all)]
    assert sorted(written) == sorted(expected)
    long_rows = [row for row in x_all if (row != PAD_ID).all()]
    assert long_rows, "the CSV should hold texts longer than --max-len, to test cutting"


def test_label_sets_and_the_recorded_label_counts_agree(agnews):
    folder = agnews[0] / "AGNews"
    config = json.loads((folder / "config.json").read_text())
    labels = set()
    for i, (_, y) in enumerate(client_arrays(folder, "train")):
        counts = np.bincount(y, minlength=4)
        assert config["Size of samples for labels in clients"][i] == [[k, int(c)] for k, c in enumerate(counts) if c]
        labels |= set(y.tolist())
    assert labels == {0, 1, 2, 3}


def test_rerun_with_other_text_settings_is_refused_and_the_rebuild_command_names_them(agnews, capsys):
    data, source = agnews
    assert generate(data, source) == 0  # same split and settings: nothing to do
    assert generate(data, source, "--max-len", "30") == 2
    assert "max_len 24 (asked 30)" in capsys.readouterr().out
    info = dataset_info("AGNews", CLIENTS, data)
    assert f"--vocab-size {VOCAB_CAP} --max-len {MAX_LEN}" in info.rebuild


def test_a_bad_csv_row_is_named(tmp_path, capsys):
    source = tmp_path / "bad.csv"
    source.write_text('1,"Title","text"\n7,"Title","text"\n')
    assert generate(tmp_path / "data", source) == 2
    assert "bad.csv, row 2" in capsys.readouterr().out
    assert not (tmp_path / "data" / "AGNews").exists()


def test_an_already_tokenised_npz_is_cut_to_max_len(tmp_path):
    x = np.tile(np.arange(1, 31, dtype=np.int32), (200, 1))
    x[::2, 10:] = 0
    np.savez(tmp_path / "tokens.npz", x=x, y=np.arange(200) % 4)
    assert generate(tmp_path / "data", tmp_path / "tokens.npz") == 0
    config = json.loads((tmp_path / "data" / "AGNews" / "config.json").read_text())
    assert config["vocab_size"] == MAX_LEN + 1 and config["input_shape"] == [MAX_LEN]
    assert generate(tmp_path / "other", tmp_path / "tokens.npz", "--vocab-size", "20") == 2  # ids reach 30


def test_a_failed_download_names_source_and_removes_what_it_wrote(tmp_path, monkeypatch):
    def no_network(url, filename):
        Path(filename).write_bytes(b"partial")
        raise URLError("[Errno 111] Connection refused")
    monkeypatch.setattr(release.urllib.request, "urlretrieve", no_network)
    with pytest.raises(DownloadError, match="Connection refused.*pass --source"):
        generate_AGNews.download_release(tmp_path / "AGNews" / "rawdata")
    assert not (tmp_path / "AGNews").exists()


# ----- the loader ---------------------------------------------------------------------------------------
def test_loader_gives_int64_token_tensors_and_refuses_ids_past_the_vocabulary(agnews, tmp_path):
    info = dataset_info("AGNews", CLIENTS, agnews[0])
    assert (info.input_kind, info.vocab_size, info.input_shape) == (TOKEN_INPUTS, VOCAB_CAP, (MAX_LEN,))
    data = load_client_data(info, 0, "train", torch.device("cpu"), num_classes=4)
    assert data.x.dtype == torch.int64 and tuple(data.x.shape[1:]) == (MAX_LEN,)
    shutil.copytree(agnews[0] / "AGNews", tmp_path / "AGNews")
    config = json.loads((tmp_path / "AGNews" / "config.json").read_text())
    (tmp_path / "AGNews" / "config.json").write_text(json.dumps(dict(config, vocab_size=5)))
    with pytest.raises(DatasetError, match="token id \\d+ is not below the vocab_size 5"):
        load_client_data(dataset_info("AGNews", CLIENTS, tmp_path), 0, "train", torch.device("cpu"), num_classes=4)


# ----- training runs ------------------------------------------------------------------------------------
def run_flags(data, results, *extra):
    return ["-data", "AGNews", "-m", "fastText", "-nc", str(CLIENTS), "-gr", "2", "-dev", "cpu", "-lr", "0.1",
            "--data_dir", str(data), "--results_dir", str(results), "--threads", "1", *extra]


@pytest.mark.parametrize("algorithm", ["FedAvg", "FedLAG", "FedRep+LAG"])
def test_text_model_trains_under_fedavg_and_lag(agnews, tmp_path, algorithm):
    assert main.main(run_flags(agnews[0], tmp_path, "-algo", algorithm)) == 0
    with h5py.File(tmp_path / f"AGNews_{algorithm}_test_0.h5", "r") as f:
        accuracy = f["rs_test_acc"][()]
        config = json.loads(f.attrs["config"])
    assert len(accuracy) == 3 and np.isfinite(accuracy).all()
    assert config["vocab_size"] == VOCAB_CAP  # -vs left out: the dataset's vocabulary


@pytest.mark.parametrize("flags, fragments", [
    (["-vs", "10"], ["-vs/--vocab_size 10", f"({VOCAB_CAP} token ids)"]),
    (["-ml", "8"], ["-ml/--max_len 8", f"at least {MAX_LEN}"]),
    (["-m", "AmazonMLP"], ["model AmazonMLP does not take token ids", "TextCNN"]),
])
def test_flags_that_do_not_fit_the_text_dataset_are_refused_in_one_line(agnews, tmp_path, capsys, flags, fragments):
    code = main.main(run_flags(agnews[0], tmp_path, *flags))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert all(fragment in err for fragment in fragments), err


# ----- Shakespeare: LEAF's next-character task, one client per role ---------------------------------------
ROLE_LINES = {"HAMLET": "To be, or not to be, that is the question. ", "GHOST": "Remember me! ",
              "OPHELIA": "O, what a noble mind is here o'erthrown. ", "POLONIUS": "Neither a borrower nor a lender be; "}


def write_leaf_json(folder, repeats=(6, 12, 5, 4), step=3):
    """Two LEAF files (as LEAF's train/ and test/ would hold) splitting each role's 80-character windows."""
    halves = ({}, {})
    for (role, line), repeat in zip(ROLE_LINES.items(), repeats):
        text = line * repeat
        starts = range(0, len(text) - 80, step)
        windows = {"x": [text[i:i + 80] for i in starts], "y": [text[i + 80] for i in starts]}
        cut = len(windows["x"]) // 2
        for half, part in zip(halves, (slice(None, cut), slice(cut, None))):
            half[role] = {key: values[part] for key, values in windows.items()}
    for name, half in zip(("train.json", "test.json"), halves):
        (folder / name).write_text(json.dumps({"users": list(half), "user_data": half}))
    return folder


@pytest.fixture(scope="module")
def shakespeare(tmp_path_factory):
    source = write_leaf_json(tmp_path_factory.mktemp("leaf"))
    data = tmp_path_factory.mktemp("shakespeare-data")
    assert generate_Shakespeare.main(["--source", str(source), "--root", str(data)]) == 0
    return data, source


def test_shakespeare_gives_each_role_its_own_client_with_every_window_once(shakespeare):
    data, source = shakespeare
    folder = data / "Shakespeare"
    config = json.loads((folder / "config.json").read_text())
    roles = generate_Shakespeare.read_roles(source)
    assert config["partition"] == "natural" and config["num_clients"] == len(ROLE_LINES)
    assert config["client_roles"] == sorted(roles, key=lambda role: (-len(roles[role][0]), role))
    alphabet = sorted(set("".join(ROLE_LINES.values())))
    assert config["vocab_size"] == len(alphabet) + 1 and config["input_shape"] == [80]
    for i, role in enumerate(config["client_roles"]):
        samples = []
        for split in ("train", "test"):
            x, y = read_client_arrays(folder / split / f"{i}.npz")
            assert x.dtype == np.int64 and x.min() >= 1 and x.max() < config["vocab_size"]
            samples += ["".join(alphabet[k - 1] for k in row) + alphabet[label - 1] for row, label in zip(x, y)]
        strings, targets = roles[role]
        assert sorted(samples) == sorted(s + t for s, t in zip(strings, targets))


def test_shakespeare_keeps_its_natural_split(shakespeare, capsys):
    data, source = shakespeare
    assert generate_Shakespeare.main(["noniid", "-", "dir", "--source", str(source), "--root", str(data)]) == 2
    assert generate_Shakespeare.main(["--num-clients", "9", "--source", str(source), "--root", str(data)]) == 2
    out = capsys.readouterr().out
    assert "natural split" in out and "only 4 roles" in out
    info = dataset_info("Shakespeare", 4, data)
    assert info.rebuild.startswith("python dataset/generate_Shakespeare.py noniid - natural --num-clients 4")


def test_a_text_model_trains_on_shakespeare(shakespeare, tmp_path):
    flags = ["-algo", "FedAvg", "-data", "Shakespeare", "-m", "fastText", "-nc", "4", "-gr", "1", "-dev", "cpu",
             "--data_dir", str(shakespeare[0]), "--results_dir", str(tmp_path), "--threads", "1"]
    assert main.main(flags) == 0
    with h5py.File(tmp_path / "Shakespeare_FedAvg_test_0.h5", "r") as f:
        assert np.isfinite(f["rs_test_acc"][()]).all()
