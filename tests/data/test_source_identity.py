"""The data a split is cut from belongs to its identity: a folder built from one ``--source`` is not taken for
the split another gives (refused without ``--force``), the same arrays again (whatever file holds them) are
nothing to do, and a folder whose config predates recorded sources is never assumed to hold a given file's
split."""
import json
import shutil

import numpy as np
import pytest

from dataset import generate_Digit5, generate_HAR
from dataset.utils.client_files import content_hash, read_client_arrays, read_config
from dataset.utils.generate import PartitionOptions, build_dataset
from dataset.utils.raw_data import images_to_float
from dataset.utils.source_identity import DIGEST_KEY, FILE_KEY
from test_sensor_data import write_har_release, zip_folder
from test_source_files import run_generator

SPLIT = ["iid", "-", "-", "--num-clients", "4"]
NOTHING_TO_DO = "already holds this split; nothing to do"


def write_source(path, channels=None, seed=0, n=200):
    """A tiny image source: ``n`` random 8x8 images (grey, or ``channels`` channels last), labels 0-9."""
    shape = (n, 8, 8) if channels is None else (n, 8, 8, channels)
    rng = np.random.default_rng(seed)
    np.savez(path, x=rng.integers(0, 256, size=shape, dtype=np.uint8), y=np.arange(n) % 10)
    return path


def digest(path):
    """The digest config.json records for an image source: of the arrays the generator partitions."""
    with np.load(path) as npz:
        return content_hash(images_to_float(npz["x"]), npz["y"].astype(np.int64))


def mnist(root, source, *flags, capsys):
    """``generate_MNIST.py iid - - --num-clients 4 [--source source] --root root flags``: (status, lines)."""
    argv = [*SPLIT, *(["--source", str(source)] if source else []), "--root", str(root), *flags]
    code, out = run_generator("MNIST", argv, capsys)
    return code, out.strip().splitlines()


def snapshot(folder):
    """Every file of a dataset folder by its path below it, with its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def sources(tmp_path):
    """Two sources with the same labels: ``a`` grey images, ``b`` RGB images."""
    return write_source(tmp_path / "a.npz"), write_source(tmp_path / "b.npz", channels=3, seed=1)


def test_a_build_from_another_source_is_refused_in_one_line_and_force_rebuilds_from_it(sources, tmp_path, capsys):
    a, b = sources
    root = tmp_path / "data"
    assert mnist(root, a, capsys=capsys)[0] == 0
    folder = root / "MNIST"
    config = read_config(folder)
    assert config[FILE_KEY] == str(a) and config[DIGEST_KEY] == digest(a)
    assert config["input_shape"] == [1, 8, 8]
    before = snapshot(folder)

    code, lines = mnist(root, b, capsys=capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0] == (f"error: {folder} holds another split (source {a} sha256:{digest(a)[:12]} (asked {b} "
                        f"sha256:{digest(b)[:12]})); pass --force to replace it, or --name to write another folder")
    assert snapshot(folder) == before  # nothing touched

    code, lines = mnist(root, b, "--force", capsys=capsys)
    assert code == 0 and lines[-1].startswith(f"wrote 4 clients to {folder}"), lines
    config = read_config(folder)
    assert config["input_shape"] == [3, 8, 8] and config[DIGEST_KEY] == digest(b)
    x, _ = read_client_arrays(folder / "train" / "0.npz")
    assert x.shape[1] == 3  # b's images, not a's
    assert mnist(root, b, capsys=capsys)[1] == [f"{folder} {NOTHING_TO_DO} (use --force to rewrite)"]


def test_the_same_arrays_again_in_any_file_are_nothing_to_do(sources, tmp_path, capsys):
    a, _ = sources
    root = tmp_path / "data"
    assert mnist(root, a, capsys=capsys)[0] == 0
    before = snapshot(root / "MNIST")
    copy = shutil.copy(a, tmp_path / "renamed.npz")
    with np.load(a) as npz:
        np.savez_compressed(tmp_path / "compressed.npz", y=npz["y"], x=npz["x"])  # other bytes, same arrays
    assert (tmp_path / "compressed.npz").read_bytes() != a.read_bytes()
    for source in (a, copy, tmp_path / "compressed.npz"):
        code, lines = mnist(root, source, capsys=capsys)
        assert code == 0 and len(lines) == 1 and NOTHING_TO_DO in lines[0], lines
    assert snapshot(root / "MNIST") == before


def test_the_published_data_is_not_taken_for_a_source_built_split_nor_the_reverse(sources, tmp_path, capsys):
    a, _ = sources
    root = tmp_path / "data"
    assert mnist(root, a, capsys=capsys)[0] == 0
    code, lines = mnist(root, None, capsys=capsys)  # refused before any download is tried
    assert code == 2 and len(lines) == 1, lines
    assert f"(source {a} sha256:" in lines[0] and "(asked the published data, no --source)" in lines[0]
    assert "--force" in lines[0]
    assert not (root / "MNIST" / "rawdata").exists()

    # A split recorded as built without --source (here the embedded Digits) refuses a file in its place.
    assert run_generator("Digits", ["--num-clients", "4", "--root", str(root)], capsys)[0] == 0
    config = read_config(root / "Digits-nc4")
    assert config[FILE_KEY] is None and len(config[DIGEST_KEY]) == 64
    code, out = run_generator("Digits", ["--num-clients", "4", "--root", str(root), "--source", str(a)], capsys)
    assert code == 2 and len(out.splitlines()) == 1, out
    assert (f"(source the published data sha256:{config[DIGEST_KEY][:12]} (asked {a} sha256:{digest(a)[:12]}))"
            in out and "--force" in out), out


def test_a_file_holding_the_published_arrays_is_the_published_split(tmp_path, capsys):
    images, labels = np.random.default_rng(3).integers(0, 256, (200, 8, 8), dtype=np.uint8), np.arange(200) % 10
    root = tmp_path / "data"
    # As a download builds it: the arrays, no --source.
    build_dataset(root / "MNIST", images_to_float(images), labels,
                  PartitionOptions(num_clients=4, non_iid=False, partition="iid"), source="MNIST")
    np.savez(tmp_path / "mnist.npz", x=images, y=labels)
    for source in (None, tmp_path / "mnist.npz"):  # the download again (not tried), or a file of its arrays
        code, lines = mnist(root, source, capsys=capsys)
        assert code == 0 and len(lines) == 1 and NOTHING_TO_DO in lines[0], lines
    assert not (root / "MNIST" / "rawdata").exists()


def test_a_folder_built_before_sources_were_recorded(sources, tmp_path, capsys):
    """Such a config says nothing of its data: a --source build cannot know the folder holds its split and
    refuses (--force rebuilds and records the file); a build of the published data takes it as before."""
    a, _ = sources
    root = tmp_path / "data"
    assert mnist(root, a, capsys=capsys)[0] == 0
    folder = root / "MNIST"
    config = read_config(folder)
    del config[FILE_KEY], config[DIGEST_KEY]
    (folder / "config.json").write_text(json.dumps(config))
    before = snapshot(folder)

    code, lines = mnist(root, a, capsys=capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0] == (f"error: {folder} was built before its source was recorded, so it may hold a split of "
                        f"other data than {a}; pass --force to rebuild it from {a}, or --name to write another "
                        f"folder")
    code, lines = mnist(root, None, capsys=capsys)
    assert code == 0 and len(lines) == 1 and NOTHING_TO_DO in lines[0], lines
    assert snapshot(folder) == before

    assert mnist(root, a, "--force", capsys=capsys)[0] == 0
    assert read_config(folder)[DIGEST_KEY] == digest(a)
    assert NOTHING_TO_DO in mnist(root, a, capsys=capsys)[1][0]


def test_digit5_compares_its_folder_of_domains(tmp_path, capsys):
    first = tmp_path / "first"
    first.mkdir()
    for i, domain in enumerate(generate_Digit5.DOMAINS):
        write_source(first / f"{domain}.npz", seed=i, n=60)
    second = shutil.copytree(first, tmp_path / "second")
    write_source(second / "usps.npz", seed=99, n=60)  # one domain's images differ
    root = tmp_path / "data"
    argv = ["--num-clients", "5", "--root", str(root), "--source"]
    assert generate_Digit5.main([*argv, str(first)]) == 0
    capsys.readouterr()
    assert generate_Digit5.main([*argv, str(first)]) == 0
    assert NOTHING_TO_DO in capsys.readouterr().out
    assert generate_Digit5.main([*argv, str(second)]) == 2
    out = capsys.readouterr().out
    assert out.startswith(f"error: {root / 'Digit5'} holds another split (source {first} sha256:") and \
        f"(asked {second} sha256:" in out and len(out.splitlines()) == 1, out


def test_a_natural_split_compares_its_release_zipped_or_not(tmp_path, capsys):
    release = write_har_release(tmp_path / "UCI HAR Dataset")
    root = tmp_path / "data"
    assert generate_HAR.main(["--source", str(release), "--root", str(root)]) == 0
    assert read_config(root / "HAR")[FILE_KEY] == str(release)
    capsys.readouterr()
    for source in (release, zip_folder(release, tmp_path / "UCI HAR Dataset.zip")):
        assert generate_HAR.main(["--source", str(source), "--root", str(root)]) == 0
        assert NOTHING_TO_DO in capsys.readouterr().out
    signal = next((release / "train" / "Inertial Signals").glob("body_gyro_z_*.txt"))
    values = np.loadtxt(signal)
    values[0, 5] += 1.0  # one reading of one window: the same subjects and windows, other data
    np.savetxt(signal, values, fmt="%15.7e")
    assert generate_HAR.main(["--source", str(release), "--root", str(root)]) == 2
    out = capsys.readouterr().out
    assert "holds another split (source" in out and len(out.splitlines()) == 1, out
