"""Sensor data end to end: UCI HAR and PAMAP2 releases -> one client per subject -> HARCNN under FedLAG.

Everything runs on small synthetic copies written here in the releases' own layouts (a "UCI HAR Dataset"
folder and its zip with three subjects; a PAMAP2 ``Protocol/`` folder and its zip with three subjects,
activity 0 rows, an activity outside the protocol and NaN dropouts); nothing is downloaded: the download
is replaced by a copy of the synthetic zip, or by a failure.
"""
import json
import shutil
import zipfile

import h5py
import numpy as np
import pytest

import main
from helpers import serve_a_broken_download
from dataset import generate_HAR, generate_PAMAP2
from dataset.utils import release
from dataset.utils.client_files import read_client_arrays
from flcore.trainmodel.models import build_model

HAR_WINDOWS = {"train": {1: 8, 3: 8}, "test": {2: 8, 3: 8}}  # split -> subject -> windows (3 in both)
PAMAP2_WINDOW, PAMAP2_STEP = 32, 16


# ----- the synthetic releases ---------------------------------------------------------------------------
def write_har_release(top):
    """``top`` laid out as "UCI HAR Dataset/": a window's first body_acc_x value is 1000 * subject + its
    number, so every written window can be traced back; activities cycle through 1-6."""
    number = 0
    for split, windows in HAR_WINDOWS.items():
        signals_dir = top / split / "Inertial Signals"
        signals_dir.mkdir(parents=True)
        subjects = np.concatenate([np.full(count, subject) for subject, count in windows.items()])
        labels = np.arange(len(subjects)) % 6 + 1
        rng = np.random.default_rng(len(subjects))
        for signal in generate_HAR.SIGNALS:
            values = rng.normal(size=(len(subjects), generate_HAR.STEPS)).astype(np.float32)
            if signal == "body_acc_x":
                values[:, 0] = 1000 * subjects + number + np.arange(len(subjects))
            np.savetxt(signals_dir / f"{signal}_{split}.txt", values, fmt="%15.7e")
        number += len(subjects)
        np.savetxt(top / split / f"y_{split}.txt", labels, fmt="%d")
        np.savetxt(top / split / f"subject_{split}.txt", subjects, fmt="%d")
    (top / "activity_labels.txt").write_text("".join(f"{i + 1} {a}\n" for i, a in enumerate(generate_HAR.ACTIVITIES)))
    return top


def zip_folder(folder, archive, junk=True):
    """``archive`` holding ``folder`` under its own name, as the releases ship (plus macOS metadata)."""
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                zf.write(path, f"{folder.name}/{path.relative_to(folder).as_posix()}")
        if junk:
            zf.writestr(f"__MACOSX/{folder.name}/._readme.txt", b"\0\5\26\7")
    return archive


# Each PAMAP2 subject's recording: runs of (activity id, steps). 0 is transient, 9 (watching TV) is an
# optional activity outside the protocol: neither gives windows.
PAMAP2_RUNS = {
    101: [(0, 20), (1, 80), (0, 10), (4, 64), (24, 40), (9, 50), (1, 20)],
    102: [(1, 48), (12, 70), (0, 15), (4, 100)],
    105: [(0, 30), (17, 60), (24, 31), (3, 90)],
}


def pamap2_recording(subject, runs):
    """(activity per step, the 54-column table): hand_acc16_x = step (in g), chest_acc16_x = subject (in g),
    with NaN dropouts in hand_acc16_x (at the start and inside runs) and in the heart rate."""
    activity = np.concatenate([np.full(steps, a) for a, steps in runs])
    steps = np.arange(len(activity), dtype=np.float64)
    rng = np.random.default_rng(subject)
    table = rng.normal(size=(len(activity), generate_PAMAP2.COLUMNS))
    table[:, 0] = steps / 100
    table[:, 1] = activity
    table[:, 2] = np.where(steps % 11 == 0, 100.0, np.nan)  # heart rate: about 9 Hz, NaN between
    hand_x, chest_x = (column for name, column in generate_PAMAP2.CHANNELS if name in ("hand_acc16_x", "chest_acc16_x"))
    table[:, hand_x] = steps * generate_PAMAP2.GRAVITY
    table[:, chest_x] = subject * generate_PAMAP2.GRAVITY
    table[[step for step in (0, 1, 40, 41, 42, 130) if step < len(table)], hand_x] = np.nan
    return activity, table


def write_dat(path, table):
    lines = (" ".join("NaN" if np.isnan(v) else f"{v:.6f}" for v in row) for row in table)
    path.write_text("\n".join(lines) + "\n")


def write_pamap2_release(top):
    (top / "Protocol").mkdir(parents=True)
    (top / "Optional").mkdir()
    for subject, runs in PAMAP2_RUNS.items():
        write_dat(top / "Protocol" / f"subject{subject}.dat", pamap2_recording(subject, runs)[1])
    write_dat(top / "Optional" / "subject101.dat", pamap2_recording(101, [(10, 100)])[1])  # never read
    (top / "readme.pdf").write_bytes(b"%PDF-1.4")
    return top


def expected_windows(runs):
    """Windows per run of a protocol activity, counted independently of the generator."""
    return sum(max(0, (steps - PAMAP2_WINDOW) // PAMAP2_STEP + 1) for a, steps in runs
               if a in generate_PAMAP2.ACTIVITIES)


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    root = tmp_path_factory.mktemp("releases")
    har = write_har_release(root / "UCI HAR Dataset")
    pamap2 = write_pamap2_release(root / "PAMAP2_Dataset")
    return {"har": har, "har_zip": zip_folder(har, root / "UCI HAR Dataset.zip"),
            "pamap2": pamap2, "pamap2_zip": zip_folder(pamap2, root / "PAMAP2_Dataset.zip")}


def pamap2_argv(source, root, *extra):
    return ["--window", str(PAMAP2_WINDOW), "--step", str(PAMAP2_STEP), "--root", str(root),
            *(["--source", str(source)] if source is not None else []), *extra]


@pytest.fixture(scope="module")
def built(releases, tmp_path_factory):
    """A data root holding HAR (from the folder) and PAMAP2 (from the folder)."""
    data = tmp_path_factory.mktemp("sensor-data")
    assert generate_HAR.main(["--source", str(releases["har"]), "--root", str(data)]) == 0
    assert generate_PAMAP2.main(pamap2_argv(releases["pamap2"], data)) == 0
    return data


def all_clients(folder):
    """[(train x, train y, test x, test y)] per client, and the config."""
    config = json.loads((folder / "config.json").read_text())
    clients = []
    for i in range(config["num_clients"]):
        clients.append((*read_client_arrays(folder / "train" / f"{i}.npz"),
                        *read_client_arrays(folder / "test" / f"{i}.npz")))
    return clients, config


def check_split_sizes(clients, config, sizes):
    """Each client holds its subject's samples, 75/25 into train and test, as config.json records."""
    for i, (x_train, y_train, x_test, y_test) in enumerate(clients):
        total = sizes[config["client_subjects"][i]]
        assert (len(y_train), len(y_test)) == (int(0.75 * total), total - int(0.75 * total))
        assert (config["train_samples"][i], config["test_samples"][i]) == (len(y_train), len(y_test))
        assert x_train.dtype == np.float32 and y_train.dtype == np.int64


# ----- HAR ----------------------------------------------------------------------------------------------
def test_har_gives_each_subject_one_client_pooling_its_train_and_test_windows(built):
    clients, config = all_clients(built / "HAR")
    sizes = {1: 8, 2: 8, 3: 16}
    assert config["partition"] == "natural" and config["num_clients"] == 3
    assert config["client_subjects"] == [3, 1, 2]  # most windows first, ties by subject
    assert config["input_shape"] == [9, 1, 128] and config["num_classes"] == 6
    assert config["channels"] == list(generate_HAR.SIGNALS) and config["label_names"][5] == "LAYING"
    check_split_sizes(clients, config, sizes)
    seen = []
    for i, (x_train, y_train, x_test, y_test) in enumerate(clients):
        stamps = np.concatenate([x_train[:, 0, 0, 0], x_test[:, 0, 0, 0]]).astype(np.int64)
        assert set(stamps // 1000) == {config["client_subjects"][i]}  # one subject per client
        assert x_train.shape[1:] == (9, 1, 128)
        seen += stamps.tolist()
    assert sorted(seen) == sorted(set(seen)) and len(seen) == sum(sizes.values())  # no window twice, none lost
    labels = set().union(*(set(c[1]) | set(c[3]) for c in clients))
    assert labels == set(range(6))


def test_har_reads_the_zip_as_it_reads_the_folder(releases, built, tmp_path):
    assert generate_HAR.main(["--source", str(releases["har_zip"]), "--root", str(tmp_path)]) == 0
    from_zip = json.loads((tmp_path / "HAR" / "config.json").read_text())
    from_folder = json.loads((built / "HAR" / "config.json").read_text())
    assert from_zip["content_sha256"] == from_folder["content_sha256"]
    # The same split again is left alone; the rebuild command the trainer prints from config.json works.
    assert generate_HAR.main(["noniid", "-", "natural", "--num-clients", "3", "--min-samples", "2",
                              "--source", str(releases["har_zip"]), "--root", str(tmp_path)]) == 0


def test_har_keeps_the_subjects_with_most_windows(releases, tmp_path):
    assert generate_HAR.main(["--num-clients", "1", "--source", str(releases["har"]), "--root", str(tmp_path)]) == 0
    config = json.loads((tmp_path / "HAR" / "config.json").read_text())
    assert config["client_subjects"] == [3] and config["train_samples"] == [12]


def break_har(top, what):
    if what == "missing":
        (top / "train" / "Inertial Signals" / "body_gyro_y_train.txt").unlink()
    elif what == "short":
        path = top / "test" / "Inertial Signals" / "total_acc_z_test.txt"
        np.savetxt(path, np.loadtxt(path)[:, :127], fmt="%15.7e")
    elif what == "label":
        (top / "train" / "y_train.txt").write_text("1\n7\n" + "2\n" * 14)


@pytest.mark.parametrize("what, message", [
    ("missing", "lacks train/Inertial Signals/body_gyro_y_train.txt"),
    ("short", "holds 16 windows of 127 steps; expected 16 (one per line of y_test.txt) of 128"),
    ("label", "y_train.txt holds 7; expected one whole number from 1 to 6 a line"),
])
def test_a_malformed_har_release_is_refused_in_one_line(releases, tmp_path, capsys, what, message):
    top = shutil.copytree(releases["har"], tmp_path / "UCI HAR Dataset")
    break_har(top, what)
    assert generate_HAR.main(["--source", str(top), "--root", str(tmp_path / "data")]) == 2
    out = capsys.readouterr().out
    assert out.startswith("error: ") and len(out.splitlines()) == 1 and message in out, out
    assert not (tmp_path / "data" / "HAR").exists()


def test_har_refuses_a_label_partition(tmp_path, capsys):
    assert generate_HAR.main(["noniid", "-", "dir", "--root", str(tmp_path)]) == 2
    assert "natural split (one client per subject)" in capsys.readouterr().out


# ----- the download path (HAR's and PAMAP2's zips) ------------------------------------------------------
def fake_download(archive, calls):
    def retrieve(url, filename):
        calls.append(url)
        shutil.copyfile(archive, filename)
    return retrieve


def test_without_source_the_zip_is_downloaded_checked_and_kept(releases, built, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(release.urllib.request, "urlretrieve", fake_download(releases["har_zip"], calls))
    assert generate_HAR.main(["--root", str(tmp_path)]) == 0
    assert calls == [generate_HAR.URL]
    assert (tmp_path / "HAR" / "rawdata" / "UCI HAR Dataset.zip").is_file()
    assert generate_HAR.main(["--root", str(tmp_path), "--force"]) == 0  # the zip there is reused
    assert calls == [generate_HAR.URL]
    monkeypatch.setattr(release.urllib.request, "urlretrieve", fake_download(releases["pamap2_zip"], calls))
    assert generate_PAMAP2.main(pamap2_argv(None, tmp_path)) == 0
    assert calls[-1] == generate_PAMAP2.URL and (tmp_path / "PAMAP2" / "rawdata" / "PAMAP2_Dataset.zip").is_file()
    for dataset in ("HAR", "PAMAP2"):  # read from the zip, the windows are those read from the folder
        from_zip, from_folder = (json.loads((root / dataset / "config.json").read_text()) for root in (tmp_path, built))
        assert from_zip["content_sha256"] == from_folder["content_sha256"]


@pytest.mark.parametrize("failure, message", [
    ("network", "could not download UCI HAR ([Errno 111] Connection refused); pass --source"),
    ("not a zip", "gave a file that is not a .zip archive holding train/Inertial Signals/; pass --source"),
])
def test_a_failed_download_names_source_and_leaves_nothing(tmp_path, monkeypatch, capsys, failure, message):
    serve_a_broken_download(monkeypatch, b"<html>maintenance</html>", refuse=failure == "network")
    assert generate_HAR.main(["--root", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert out.startswith("error: ") and message in out, out
    assert not (tmp_path / "HAR").exists()


# ----- PAMAP2 -------------------------------------------------------------------------------------------
def test_pamap2_cuts_windows_inside_runs_of_one_protocol_activity(built):
    clients, config = all_clients(built / "PAMAP2")
    sizes = {subject: expected_windows(runs) for subject, runs in PAMAP2_RUNS.items()}
    assert config["client_subjects"] == sorted(sizes, key=lambda s: (-sizes[s], s))
    assert config["input_shape"] == [18, 1, PAMAP2_WINDOW] and config["num_classes"] == 12
    assert config["label_activity_ids"] == [1, 2, 3, 4, 5, 6, 7, 12, 13, 16, 17, 24]
    assert config["generator_settings"] == {"window": PAMAP2_WINDOW, "step": PAMAP2_STEP}
    check_split_sizes(clients, config, sizes)
    hand_x, chest_x = (config["channels"].index(name) for name in ("hand_acc16_x", "chest_acc16_x"))
    seen = set()
    for i, (x_train, y_train, x_test, y_test) in enumerate(clients):
        subject = config["client_subjects"][i]
        activity = pamap2_recording(subject, PAMAP2_RUNS[subject])[0]
        for x, y in ((x_train, y_train), (x_test, y_test)):
            for window, label in zip(x, y):
                steps = window[hand_x, 0]  # the step numbers, in g: NaN dropouts interpolated back
                start = int(steps[-1]) - PAMAP2_WINDOW + 1
                assert np.array_equal(steps[2:], np.arange(start + 2, start + PAMAP2_WINDOW, dtype=np.float32))
                assert (window[chest_x, 0] == subject).all()  # the client's subject
                held = set(activity[start:start + PAMAP2_WINDOW].tolist())
                assert held == {config["label_activity_ids"][label]}  # one protocol activity throughout
                assert (subject, start) not in seen
                seen.add((subject, start))
    assert len(seen) == sum(sizes.values())


def test_pamap2_fills_a_leading_gap_with_the_nearest_value(built):
    clients, config = all_clients(built / "PAMAP2")
    hand_x = config["channels"].index("hand_acc16_x")
    first = [w[hand_x, 0] for c in clients for x in (c[0], c[2]) for w in x if w[hand_x, 0, -1] < PAMAP2_WINDOW]
    assert first, "subject 102 starts with a protocol activity, so one window starts at step 0"
    assert first[0][:3].tolist() == [2.0, 2.0, 2.0]  # steps 0 and 1 were NaN: they take step 2's value


@pytest.mark.parametrize("what, message", [
    ("columns", "subject102.dat has 53 columns; expected 54"),
    ("text", "subject105.dat is not a table of numbers"),
    ("empty", "holds no subject<id>.dat"),
    ("all nan", "subject101.dat: channel ankle_gyro_z holds no value at all"),
])
def test_a_malformed_pamap2_release_is_refused_in_one_line(releases, tmp_path, capsys, what, message):
    top = shutil.copytree(releases["pamap2"], tmp_path / "PAMAP2_Dataset")
    protocol = top / "Protocol"
    if what == "columns":
        write_dat(protocol / "subject102.dat", pamap2_recording(102, PAMAP2_RUNS[102])[1][:, :53])
    elif what == "text":
        (protocol / "subject105.dat").write_text("0.00 1 NaN hello\n")
    elif what == "empty":
        for path in protocol.iterdir():
            path.unlink()
    else:
        _, table = pamap2_recording(101, PAMAP2_RUNS[101])
        table[:, dict(generate_PAMAP2.CHANNELS)["ankle_gyro_z"]] = np.nan
        write_dat(protocol / "subject101.dat", table)
    assert generate_PAMAP2.main(pamap2_argv(top, tmp_path / "data")) == 2
    out = capsys.readouterr().out
    assert out.startswith("error: ") and len(out.splitlines()) == 1 and message in out, out


def test_pamap2_rebuilds_only_when_the_window_settings_change(releases, built, capsys):
    assert generate_PAMAP2.main(pamap2_argv(releases["pamap2_zip"], built)) == 0  # same split: nothing to do
    assert "nothing to do" in capsys.readouterr().out
    assert generate_PAMAP2.main(pamap2_argv(releases["pamap2_zip"], built, "--step", "8")) == 2
    assert "step 16 (asked 8)" in capsys.readouterr().out
    assert generate_PAMAP2.main(pamap2_argv(releases["pamap2"], built, "--window", "20")) == 2
    assert "--window must be >= 28" in capsys.readouterr().out


# ----- training: HARCNN under FedAvg, FedLAG and FedRep+LAG-----------------------------------------------------
def parameter_layers(model):
    """The model's modules that hold parameters of their own: the layers LAG scores."""
    return [name for name, module in model.named_modules() if any(True for _ in module.parameters(recurse=False))]


@pytest.mark.parametrize("dataset", ["HAR", "PAMAP2"])
@pytest.mark.parametrize("algorithm", ["FedAvg", "FedLAG", "FedRep+LAG"])
def test_harcnn_trains_on_each_subject(built, tmp_path, dataset, algorithm):
    flags = ["-algo", algorithm, "-data", dataset, "-m", "HARCNN", "-nc", "3", "-gr", "1", "-dev", "cpu",
             "-lr", "0.05", "--data_dir", str(built), "--results_dir", str(tmp_path), "--threads", "1"]
    assert main.main(flags) == 0
    with h5py.File(tmp_path / f"{dataset}_{algorithm}_test_0.h5", "r") as f:
        accuracy = f["rs_test_acc"][()]
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in f.get("lag_layer_names", [])]
    assert len(accuracy) == 2 and np.isfinite(accuracy).all() and ((0 <= accuracy) & (accuracy <= 1)).all()
    if algorithm == "FedAvg":
        assert names == []  # plain FedAvg records no conflict analysis
        return
    config = json.loads((built / dataset / "config.json").read_text())
    layers = parameter_layers(build_model("HARCNN", config["input_shape"], config["num_classes"]))
    base = [f"base.{name}" for name in layers if name != "fc"]  # the trainer splits off fc as the head
    # FedLAG ranks every layer; FedRep+LAG only FedRep's shared base (its head is personal already).
    assert names == (base + ["head"] if algorithm == "FedLAG" else base)
