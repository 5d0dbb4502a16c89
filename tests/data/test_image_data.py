"""Image datasets end to end: FEMNIST (LEAF JSON, one client per writer), Omniglot (resized to 28x28),
Tiny ImageNet (its folder, its zip or a .npz) and Digit5 (five digit domains, one domain per client)
-> per-client files -> small models under FedLAG and FedRep+LAG.

Every source is a small synthetic copy written here in the real format (a LEAF JSON of five writers; a
Tiny ImageNet folder and zip of JPEGs in three wnids; .npz files); nothing is downloaded: torchvision's
classes and ``urlretrieve`` are replaced by fakes that serve synthetic data, or fail.
"""
import hashlib
import json
import shutil
import zipfile
from pathlib import Path
from urllib.error import URLError

import h5py
import numpy as np
import pytest
import torchvision.datasets
from PIL import Image

import main
from dataset import generate_Digit5, generate_FEMNIST, generate_Omniglot, generate_TinyImagenet
from dataset.utils.client_files import read_client_arrays
from dataset.utils.images import GREY, RGB, float_images, resize_images
from flcore.trainmodel.models import build_model

# FEMNIST: writer -> samples. LEAF's train/ and test/ files each hold part of every writer's samples.
WRITERS = {"f0003_12": 30, "f0001_40": 24, "f0142_07": 24, "f0007_33": 18, "f0510_21": 3}
KEPT_WRITERS = 4
TINY_WNIDS = ("n01443537", "n02099601", "n01910747")  # not in sorted order, as the release's wnids.txt
TINY_TRAIN, TINY_VAL = 16, 4  # images per wnid
DIGIT_SHAPES = {"mnist": (28, 28), "mnistm": (28, 28, 3), "svhn": (32, 32, 3), "syn": (32, 32, 3), "usps": (16, 16)}
DIGIT_SAMPLES = 40
DIGIT_CLIENTS = 10


# ----- the synthetic sources ----------------------------------------------------------------------------
def noisy_images(n, shape, labels, seed):
    """uint8 images whose mean brightness follows the label, with noise: learnable and all distinct."""
    rng = np.random.default_rng(seed)
    base = (40 + 200 * np.asarray(labels) / max(1, int(np.max(labels)))).reshape(-1, *[1] * len(shape))
    return np.clip(base + rng.normal(0, 25, size=(n, *shape)), 0, 255).astype(np.uint8)


def write_leaf_femnist(folder, writers=WRITERS, seed=0):
    """train.json and test.json in LEAF's form, each writer's samples cut between them; pixels k / 255."""
    rng = np.random.default_rng(seed)
    halves = ({}, {})
    for writer, count in writers.items():
        labels = rng.integers(0, 62, size=count)
        labels[0] = 61  # the last class occurs
        pixels = noisy_images(count, (784,), labels, rng.integers(1 << 30)) / 255.0
        cut = count // 2
        for half, part in zip(halves, (slice(None, cut), slice(cut, None))):
            half[writer] = {"x": pixels[part].tolist(), "y": labels[part].tolist()}
    for name, half in zip(("train.json", "test.json"), halves):
        users = list(half)
        (folder / name).write_text(json.dumps({"users": users, "num_samples": [len(half[u]["y"]) for u in users],
                                               "user_data": half}))
    return folder


def femnist_samples(folder):
    """writer -> sorted (pixel bytes + label) of every sample, as the generator should store it."""
    samples = {}
    for path in sorted(folder.glob("*.json")):
        for writer, data in json.loads(path.read_text())["user_data"].items():
            images = np.rint(np.asarray(data["x"]) * 255).astype(np.uint8).reshape(-1, 28, 28)
            samples.setdefault(writer, []).extend(sample_keys(float_images(images), data["y"]))
    return {writer: sorted(keys) for writer, keys in samples.items()}


def sample_keys(x, y):
    return [row.tobytes() + int(label).to_bytes(2, "little") for row, label in zip(x, y)]


def write_tiny_release(top, grey_image=True):
    """``top`` laid out as tiny-imagenet-200/: wnids.txt, train/<wnid>/images/*.JPEG with their boxes file,
    val/images/*.JPEG with val_annotations.txt, and an unlabelled test/ image. Each wnid has its own colour."""
    rng = np.random.default_rng(1)
    top.mkdir(parents=True)
    (top / "wnids.txt").write_text("".join(f"{w}\n" for w in TINY_WNIDS))
    colours = {wnid: rng.integers(30, 226, size=3) for wnid in TINY_WNIDS}

    def jpeg(path, wnid, grey=False):
        pixels = np.clip(colours[wnid] + rng.normal(0, 20, size=(64, 64, 3)), 0, 255).astype(np.uint8)
        image = Image.fromarray(pixels)
        path.parent.mkdir(parents=True, exist_ok=True)
        (image.convert("L") if grey else image).save(path, "JPEG")

    for wnid in TINY_WNIDS:
        for i in range(TINY_TRAIN):
            jpeg(top / "train" / wnid / "images" / f"{wnid}_{i}.JPEG", wnid, grey=grey_image and i == 0)
        (top / "train" / wnid / f"{wnid}_boxes.txt").write_text("")
    lines = []
    for i in range(TINY_VAL * len(TINY_WNIDS)):
        wnid = TINY_WNIDS[i % len(TINY_WNIDS)]
        jpeg(top / "val" / "images" / f"val_{i}.JPEG", wnid)
        lines.append(f"val_{i}.JPEG\t{wnid}\t0\t0\t63\t63\n")
    (top / "val" / "val_annotations.txt").write_text("".join(lines))
    jpeg(top / "test" / "images" / "test_0.JPEG", TINY_WNIDS[0])
    return top


def zip_folder(folder, archive):
    """``archive`` holding ``folder`` under its own name, as the release ships."""
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                zf.write(path, f"{folder.name}/{path.relative_to(folder).as_posix()}")
    return archive


def write_digit_domains(folder, domains=tuple(DIGIT_SHAPES)):
    """One .npz per domain in the domain's own size and colour; labels cycle through the ten digits."""
    folder.mkdir(parents=True, exist_ok=True)
    for seed, domain in enumerate(domains):
        y = np.arange(DIGIT_SAMPLES) % 10
        np.savez(folder / f"{domain}.npz", x=noisy_images(DIGIT_SAMPLES, DIGIT_SHAPES[domain], y, seed), y=y)
    return folder


def client_arrays(folder, split, clients):
    return [read_client_arrays(folder / split / f"{i}.npz") for i in range(clients)]


def all_client_keys(folder, clients):
    """client -> its train and test samples as keys."""
    return {i: sample_keys(*read_client_arrays(folder / "train" / f"{i}.npz"))
            + sample_keys(*read_client_arrays(folder / "test" / f"{i}.npz")) for i in range(clients)}


def config_of(folder):
    return json.loads((folder / "config.json").read_text())


def last_line(capsys):
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.strip()]
    return lines[-1] if lines else ""


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("sources")
    leaf = root / "leaf"
    leaf.mkdir()
    write_leaf_femnist(leaf)
    labels = np.repeat(np.arange(12), 20)  # 12 characters, 20 drawings each, like Omniglot's
    np.savez(root / "omniglot.npz", x=noisy_images(len(labels), (105, 105), labels, 3), y=labels)
    tiny = write_tiny_release(root / "tiny-imagenet-200")
    return {"leaf": leaf, "omniglot": root / "omniglot.npz", "tiny": tiny,
            "tiny_zip": zip_folder(tiny, root / "tiny-imagenet-200.zip"),
            "digits": write_digit_domains(root / "digit5")}


@pytest.fixture(scope="module")
def built(sources, tmp_path_factory):
    """A data root holding all four datasets, built from the synthetic sources."""
    data = tmp_path_factory.mktemp("image-data")
    assert generate_FEMNIST.main(["--source", str(sources["leaf"]), "--num-clients", str(KEPT_WRITERS),
                                  "--root", str(data)]) == 0
    assert generate_Omniglot.main(["noniid", "-", "dir", "--alpha", "1.0", "--num-clients", "4",
                                   "--source", str(sources["omniglot"]), "--root", str(data)]) == 0
    assert generate_TinyImagenet.main(["noniid", "-", "dir", "--alpha", "1.0", "--num-clients", "3",
                                       "--source", str(sources["tiny"]), "--root", str(data)]) == 0
    assert generate_Digit5.main(["--num-clients", str(DIGIT_CLIENTS), "--source", str(sources["digits"]),
                                 "--root", str(data)]) == 0
    return data


# ----- FEMNIST: one client per writer ----------------------------------------------------------------------
def test_femnist_gives_each_of_the_largest_writers_its_own_client(sources, built):
    folder = built / "FEMNIST"
    config = config_of(folder)
    largest = sorted(WRITERS, key=lambda w: (-WRITERS[w], w))[:KEPT_WRITERS]
    assert config["partition"] == "natural" and config["client_writers"] == largest
    assert config["num_classes"] == 62 and config["input_shape"] == [1, 28, 28]
    expected = femnist_samples(sources["leaf"])
    for i, writer in enumerate(largest):
        x, _ = read_client_arrays(folder / "train" / f"{i}.npz")
        assert x.dtype == np.float32 and x.min() >= -1 and x.max() <= 1
        assert sorted(all_client_keys(folder, KEPT_WRITERS)[i]) == expected[writer]  # pooled over both files


def test_femnist_without_source_names_leafs_command(tmp_path, capsys):
    assert generate_FEMNIST.main(["--root", str(tmp_path)]) == 2
    line = last_line(capsys)
    assert line.startswith("error: FEMNIST has no download") and "--source" in line and "preprocess.sh" in line
    assert generate_FEMNIST.main(["noniid", "-", "dir", "--source", str(tmp_path)]) == 2
    assert "natural split (one client per writer)" in last_line(capsys)


# ----- Omniglot: resized to 28x28, label partitions ----------------------------------------------------------
def test_omniglot_is_resized_and_every_drawing_lands_in_one_client(sources, built):
    folder = built / "Omniglot"
    config = config_of(folder)
    assert config["input_shape"] == [1, 28, 28] and config["num_classes"] == 12
    assert (config["partition"], config["alpha"], config["num_clients"]) == ("dir", 1.0, 4)
    with np.load(sources["omniglot"]) as npz:
        expected = sample_keys(float_images(resize_images(npz["x"], 28, GREY)), npz["y"])
    written = [key for keys in all_client_keys(folder, 4).values() for key in keys]
    assert len(set(written)) == len(written) and sorted(written) == sorted(expected)
    for i, (x, y) in enumerate(client_arrays(folder, "train", 4)):
        assert x.dtype == np.float32 and x.shape[1:] == (1, 28, 28)
        assert config["Size of samples for labels in clients"][i] == [[int(k), int(c)] for k, c in
                                                                       zip(*np.unique(y, return_counts=True))]


class FakeOmniglot:
    """torchvision's Omniglot as the generator uses it: (PIL image, character) items of one set."""
    calls = []

    def __init__(self, root, background=True, download=False):
        FakeOmniglot.calls.append((Path(root), background, download))
        self.characters = 3 if background else 2
        self.drawings = noisy_images(4 * self.characters, (105, 105), np.arange(4 * self.characters) % 3,
                                     int(background))

    def __len__(self):
        return len(self.drawings)

    def __getitem__(self, i):
        return Image.fromarray(self.drawings[i]), i % self.characters


def test_omniglot_downloads_both_sets_without_source(tmp_path, monkeypatch):
    FakeOmniglot.calls = []
    monkeypatch.setattr(torchvision.datasets, "Omniglot", FakeOmniglot)
    assert generate_Omniglot.main(["iid", "balance", "-", "--num-clients", "2", "--root", str(tmp_path)]) == 0
    raw = tmp_path / "Omniglot" / "rawdata"
    assert FakeOmniglot.calls == [(raw, True, True), (raw, False, True)]
    config = config_of(tmp_path / "Omniglot")
    assert config["num_classes"] == 5  # the evaluation set's 2 characters follow the background's 3
    folder = tmp_path / "Omniglot"
    labels = np.concatenate([y for split in ("train", "test") for _, y in client_arrays(folder, split, 2)])
    assert np.bincount(labels).tolist() == [4] * 5  # 4 drawings of each character


def test_a_failed_omniglot_download_names_source_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    def offline(root, background=True, download=False):
        (Path(root) / "omniglot-py").mkdir(parents=True)
        raise URLError("[Errno 111] Connection refused")
    monkeypatch.setattr(torchvision.datasets, "Omniglot", offline)
    assert generate_Omniglot.main(["--root", str(tmp_path)]) == 2
    line = last_line(capsys)
    assert line.startswith("error: could not download Omniglot (") and "Connection refused" in line
    assert "--source" in line and not (tmp_path / "Omniglot").exists()


# ----- Tiny ImageNet: folder, zip or .npz ----------------------------------------------------------------
def test_tiny_imagenet_pools_train_and_annotated_val_images(sources, built):
    folder = built / "TinyImagenet"
    config = config_of(folder)
    assert config["input_shape"] == [3, 64, 64] and config["num_classes"] == 3
    assert config["class_wnids"] == sorted(TINY_WNIDS)
    counts = np.zeros(3, dtype=int)
    for split in ("train", "test"):
        for x, y in client_arrays(folder, split, 3):
            assert x.dtype == np.float32 and x.shape[1:] == (3, 64, 64)
            counts += np.bincount(y, minlength=3)
    assert counts.tolist() == [TINY_TRAIN + TINY_VAL] * 3  # no val image lost to one label, none of test/


def test_tiny_imagenet_reads_the_zip_as_the_folder_and_makes_grey_jpegs_rgb(sources, tmp_path):
    x, y, wnids = generate_TinyImagenet.read_release(sources["tiny_zip"])
    x_folder, y_folder, _ = generate_TinyImagenet.read_release(sources["tiny"])
    assert np.array_equal(x, x_folder) and np.array_equal(y, y_folder) and wnids == sorted(TINY_WNIDS)
    assert x.shape == (3 * (TINY_TRAIN + TINY_VAL), 64, 64, 3) and x.dtype == np.uint8
    grey = x[[i for i in range(len(y)) if i % TINY_TRAIN == 0][:3]]  # each wnid's first train image
    assert all(np.array_equal(image[..., 0], image[..., 2]) for image in grey)
    # Labels follow the folders and the annotations: a val image's label is its wnid's sorted position.
    val_labels = y[3 * TINY_TRAIN:]
    assert val_labels.tolist() == [sorted(TINY_WNIDS).index(TINY_WNIDS[i % 3]) for i in range(3 * TINY_VAL)]
    np.savez(tmp_path / "tiny.npz", x=x, y=y)
    assert generate_TinyImagenet.main(["--num-clients", "2", "--alpha", "1.0", "--source", str(tmp_path / "tiny.npz"),
                                       "--root", str(tmp_path / "data")]) == 0
    assert config_of(tmp_path / "data" / "TinyImagenet")["input_shape"] == [3, 64, 64]


def md5_of(path):
    return hashlib.md5(Path(path).read_bytes()).hexdigest()


def test_tiny_imagenet_downloads_the_zip_and_reads_it_in_place(sources, tmp_path, monkeypatch):
    fetched = []

    def copy_zip(url, filename):
        fetched.append(url)
        shutil.copyfile(sources["tiny_zip"], filename)
    monkeypatch.setattr(generate_TinyImagenet, "ZIP_MD5", md5_of(sources["tiny_zip"]))
    monkeypatch.setattr("urllib.request.urlretrieve", copy_zip)
    argv = ["--num-clients", "2", "--alpha", "1.0", "--root", str(tmp_path)]
    assert generate_TinyImagenet.main(argv) == 0
    assert fetched == [generate_TinyImagenet.URL]
    raw = tmp_path / "TinyImagenet" / "rawdata"
    assert sorted(p.name for p in raw.iterdir()) == ["tiny-imagenet-200.zip"]  # kept, not extracted
    assert generate_TinyImagenet.main([*argv, "--force"]) == 0 and len(fetched) == 1  # the checked zip is reused


@pytest.mark.parametrize("failure, message", [
    ("network", "could not download Tiny ImageNet ([Errno 111] Connection refused); pass --source"),
    ("checksum", "did not match its published checksum; pass --source"),
])
def test_a_failed_tiny_imagenet_download_names_source_and_leaves_nothing(sources, tmp_path, monkeypatch, capsys,
                                                                          failure, message):
    def fetch(url, filename):
        shutil.copyfile(sources["tiny_zip"], filename)
        if failure == "network":
            raise URLError("[Errno 111] Connection refused")
    monkeypatch.setattr("urllib.request.urlretrieve", fetch)
    assert generate_TinyImagenet.main(["--root", str(tmp_path)]) == 2
    line = last_line(capsys)
    assert line.startswith("error: ") and message in line, line
    assert not (tmp_path / "TinyImagenet").exists()


# ----- Digit5: one domain per client -----------------------------------------------------------------------
def domain_keys(folder):
    """domain -> the keys of its samples as the generator stores them (32x32 RGB floats)."""
    keys = {}
    for domain in DIGIT_SHAPES:
        with np.load(folder / f"{domain}.npz") as npz:
            keys[domain] = set(sample_keys(float_images(resize_images(npz["x"], 32, RGB)), npz["y"]))
    return keys


def test_digit5_gives_each_client_group_one_domain_split_iid(sources, built):
    folder = built / "Digit5"
    config = config_of(folder)
    assert config["client_domains"] == [generate_Digit5.DOMAINS[i % 5] for i in range(DIGIT_CLIENTS)]
    assert (config["partition"], config["non_iid"], config["num_classes"]) == ("iid", False, 10)
    assert config["input_shape"] == [3, 32, 32]
    expected = domain_keys(sources["digits"])
    clients = all_client_keys(folder, DIGIT_CLIENTS)
    written = [key for keys in clients.values() for key in keys]
    assert len(set(written)) == len(written) == 5 * DIGIT_SAMPLES  # every sample once
    for i, keys in clients.items():
        assert set(keys) <= expected[config["client_domains"][i]]
    for train, test in zip(client_arrays(folder, "train", DIGIT_CLIENTS), client_arrays(folder, "test", DIGIT_CLIENTS)):
        assert train[0].dtype == np.float32 and set(train[1]) | set(test[1]) == set(range(10))  # IID: every digit


def test_digit5_cuts_domains_to_domain_samples_and_splits_them_by_dirichlet(sources, tmp_path):
    argv = ["noniid", "-", "dir", "--alpha", "0.5", "--num-clients", "5", "--domain-samples", "30",
            "--min-samples", "10", "--source", str(sources["digits"]), "--root", str(tmp_path)]
    assert generate_Digit5.main(argv) == 0
    config = config_of(tmp_path / "Digit5")
    assert [a + b for a, b in zip(config["train_samples"], config["test_samples"])] == [30] * 5
    assert config["generator_settings"] == {"domain_samples": 30} and config["partition"] == "dir"


def fake_digits(shape, **marks):
    """A torchvision digit class as the generator uses it (data, targets or labels), recording its calls."""
    class Fake:
        calls = []

        def __init__(self, root, download=False, **split):
            Fake.calls.append((Path(root), tuple(split.values()), download))
            y = np.arange(20) % 10
            self.data = noisy_images(20, shape, y, len(Fake.calls))
            setattr(self, marks.get("labels", "targets"), y)
    return Fake


def test_digit5_downloads_the_domains_torchvision_has(sources, tmp_path, monkeypatch):
    folder = tmp_path / "given"
    folder.mkdir()
    for domain in ("mnistm", "syn"):
        shutil.copy(sources["digits"] / f"{domain}.npz", folder)
    fakes = {"MNIST": fake_digits((28, 28)), "USPS": fake_digits((16, 16)),
             "SVHN": fake_digits((3, 32, 32), labels="labels")}
    for name, fake in fakes.items():
        monkeypatch.setattr(torchvision.datasets, name, fake)
    assert generate_Digit5.main(["--num-clients", "5", "--source", str(folder), "--root", str(tmp_path)]) == 0
    raw = tmp_path / "Digit5" / "rawdata"
    assert fakes["MNIST"].calls == fakes["USPS"].calls == [(raw, (True,), True), (raw, (False,), True)]
    assert fakes["SVHN"].calls == [(raw, ("train",), True), (raw, ("test",), True)]
    config = config_of(tmp_path / "Digit5")
    sizes = [a + b for a, b in zip(config["train_samples"], config["test_samples"])]
    assert sizes == [40, DIGIT_SAMPLES, 40, DIGIT_SAMPLES, 40]  # downloads: 20 train + 20 test


def test_digit5_names_the_two_domains_it_cannot_download_before_downloading(sources, tmp_path, monkeypatch, capsys):
    calls = []
    recording = {domain: lambda *args: calls.append(args) for domain in ("mnist", "svhn", "usps")}
    monkeypatch.setattr(generate_Digit5, "DOWNLOADS", recording)
    assert generate_Digit5.main(["--root", str(tmp_path)]) == 2
    line = last_line(capsys)
    assert "MNIST-M and SynthDigits have no download" in line and "--source" in line
    assert "mnistm.npz and syn.npz" in line
    assert calls == [] and not (tmp_path / "Digit5").exists()


def test_a_failed_digit5_download_names_source(sources, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "given"
    folder.mkdir()
    for domain in ("mnist", "mnistm", "syn", "usps"):
        shutil.copy(sources["digits"] / f"{domain}.npz", folder)

    def offline(root, split="train", download=False):
        raise RuntimeError("Error downloading train_32x32.mat: Connection refused")
    monkeypatch.setattr(torchvision.datasets, "SVHN", offline)
    assert generate_Digit5.main(["--source", str(folder), "--root", str(tmp_path)]) == 2
    line = last_line(capsys)
    assert line.startswith("error: could not download SVHN (") and "Connection refused" in line
    assert "pass --source" in line and "svhn.npz" in line


def test_digit5_refuses_fewer_clients_than_domains(sources, tmp_path, capsys):
    argv = ["--num-clients", "4", "--source", str(sources["digits"]), "--root", str(tmp_path)]
    assert generate_Digit5.main(argv) == 2
    assert "--num-clients must be at least 5, one client per domain" in last_line(capsys)


# ----- malformed sources ---------------------------------------------------------------------------------
def break_leaf(folder):
    data = json.loads((folder / "train.json").read_text())
    data["user_data"]["f0001_40"]["x"][0] = data["user_data"]["f0001_40"]["x"][0][:783]
    (folder / "train.json").write_text(json.dumps(data))


def break_tiny_annotations(top):
    (top / "val" / "val_annotations.txt").unlink()


def break_tiny_jpeg(top):
    (top / "train" / TINY_WNIDS[1] / "images" / f"{TINY_WNIDS[1]}_3.JPEG").write_bytes(b"not a jpeg")


def break_usps_labels(folder):
    np.savez(folder / "usps.npz", x=np.zeros((20, 16, 16), np.uint8), y=np.arange(20))


@pytest.mark.parametrize("dataset, breaker, message", [
    ("leaf", break_leaf, "is not LEAF JSON: user_data with x and y per writer, at writer 'f0001_40'"),
    ("omniglot", None, "x must hold uint8 images"),
    ("tiny", break_tiny_annotations, "lacks val/val_annotations.txt; expected Tiny ImageNet's layout"),
    ("tiny", break_tiny_jpeg, f"train/{TINY_WNIDS[1]}/images/{TINY_WNIDS[1]}_3.JPEG is not a readable image"),
    ("digits", break_usps_labels, "labels must be the digits 0-9; found 19"),
])
def test_a_malformed_source_is_refused_in_one_line(sources, tmp_path, capsys, dataset, breaker, message):
    source = tmp_path / sources[dataset].name
    if dataset == "omniglot":
        np.savez(source, x=np.zeros((10, 28, 28), np.float32), y=np.arange(10))
    elif source.suffix:
        shutil.copy(sources[dataset], source)
    else:
        shutil.copytree(sources[dataset], source)
    if breaker:
        breaker(source)
    generator = {"leaf": generate_FEMNIST, "omniglot": generate_Omniglot, "tiny": generate_TinyImagenet,
                 "digits": generate_Digit5}[dataset]
    assert generator.main(["--source", str(source), "--root", str(tmp_path / "data")]) == 2
    out = capsys.readouterr().out
    assert out.startswith("error: ") and len(out.splitlines()) == 1 and message in out, out
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())


# ----- training: small models under FedLAG and FedRep+LAG ----------------------------------------------------
def parameter_layers(model):
    """The model's modules that hold parameters of their own: the layers LAG scores."""
    return [name for name, module in model.named_modules() if any(True for _ in module.parameters(recurse=False))]


RUNS = [(dataset, model, algorithm) for dataset, model, clients in
        [("FEMNIST", "CNN", 4), ("Omniglot", "CNN", 4), ("TinyImagenet", "LeNet", 3), ("Digit5", "CNN", 10)]
        for algorithm in ("FedLAG", "FedRep+LAG")]
# Digit5: the first 5 of its 10 clients, which still hold one domain each (client i has domain i % 5).
CLIENTS = {"FEMNIST": KEPT_WRITERS, "Omniglot": 4, "TinyImagenet": 3, "Digit5": 5}


@pytest.mark.parametrize("dataset, model, algorithm", RUNS)
def test_a_small_model_trains_under_lag(built, tmp_path, dataset, model, algorithm):
    flags = ["-algo", algorithm, "-data", dataset, "-m", model, "-nc", str(CLIENTS[dataset]), "-gr", "1",
             "-dev", "cpu", "-lr", "0.05", "--data_dir", str(built), "--results_dir", str(tmp_path), "--threads", "1"]
    assert main.main(flags) == 0
    with h5py.File(tmp_path / f"{dataset}_{algorithm}_test_0.h5", "r") as f:
        accuracy = f["rs_test_acc"][()]
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in f["lag_layer_names"][()]]
    assert len(accuracy) == 2 and np.isfinite(accuracy).all() and ((0 <= accuracy) & (accuracy <= 1)).all()
    config = config_of(built / dataset)
    layers = parameter_layers(build_model(model, config["input_shape"], config["num_classes"]))
    base = [f"base.{name}" for name in layers if name != "fc"]  # the trainer splits off fc as the head
    # FedLAG ranks every layer; FedRep+LAG only FedRep's shared base (its head is personal already).
    assert names == (base + ["head"] if algorithm == "FedLAG" else base)
