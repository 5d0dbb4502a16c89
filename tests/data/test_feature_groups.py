"""Feature shift in the generators (--feature-groups, --feature-shift, --severity, --corruptions): on real
MNIST and CIFAR-10 subsets, client g's images are the unshifted split's under group g's transform, group 0
is untouched, the same options give the same bytes, config.json records the shift and reuse compares it;
bad requests are refused in one line before anything is written; folder names spell the shift and read
back (hints, the embedded Digits)."""
import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

import main
from helpers import REPO
from dataset import generate_AGNews, generate_Digits, generate_FEMNIST, generate_HAR
from dataset.utils.client_files import read_client_arrays, read_config
from dataset.utils.command_line import folder_suggestion
from dataset.utils.command_line import main as generate_main
from dataset.utils.feature_groups import NOISE_STREAM, floats_to_pixels, pixels_to_floats
from dataset.utils.feature_shift import gaussian_blur, gaussian_noise
from dataset.utils.generate import PartitionOptions, build_dataset, split_differences
from dataset.utils.naming import feature_shift_from_word, feature_shift_word
from dataset.utils.raw_data import images_to_float
from dataset.utils.torchvision_splits import torchvision_loader
from utils.dataset_hints import generate_command, split_from_name

SHARED_DATA = REPO.parent / "shared" / "data"
SUBSET = 600
SHIFT_FIELDS = ("feature_groups", "feature_shift", "corruption_severity", "corruptions")


def real_subset(tmp_path_factory, name: str) -> Path:
    """The first 600 images of ``../shared/data/<name>`` as a --source file (skipped when it is absent)."""
    path = SHARED_DATA / name
    if not path.is_file():
        pytest.skip(f"{path} is absent: these tests build from the real images shipped beside the repository")
    with np.load(path, allow_pickle=False) as npz:
        x, y = npz["x"][:SUBSET], npz["y"][:SUBSET]
    out = tmp_path_factory.mktemp("source") / f"{SUBSET}-{name}"
    np.savez(out, x=x, y=y)
    return out


@pytest.fixture(scope="module")
def mnist(tmp_path_factory):
    return real_subset(tmp_path_factory, "mnist-70k.npz")


@pytest.fixture(scope="module")
def cifar10(tmp_path_factory):
    return real_subset(tmp_path_factory, "cifar10-20k.npz")


def generate(name: str, source: Path, root: Path, folder: str, *flags: str, capsys=None):
    """Run ``generate_<name>.py`` in process; (exit code, what it printed)."""
    loader = torchvision_loader({"MNIST": "MNIST", "Cifar10": "CIFAR10"}[name])
    code = generate_main(name, loader, [*flags, "--source", str(source), "--root", str(root), "--name", folder])
    return code, (capsys.readouterr().out if capsys else "")


def arrays(folder: Path, split: str, client: int):
    return read_client_arrays(folder / split / f"{client}.npz")


def assert_one_line(code: int, out: str, *fragments: str) -> None:
    lines = [line for line in out.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), out
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# ----- real files --------------------------------------------------------------------------------------------
def test_rotated_mnist_is_the_plain_split_turned_by_each_clients_group(mnist, tmp_path, capsys):
    split = ["noniid", "-", "dir", "--alpha", "0.5", "--num-clients", "4"]
    assert generate("MNIST", mnist, tmp_path, "MNIST-dir0.5-nc4", *split)[0] == 0
    assert generate("MNIST", mnist, tmp_path, "MNIST-dir0.5-rot4-nc4", *split, "--feature-groups", "4")[0] == 0
    plain, rotated = tmp_path / "MNIST-dir0.5-nc4", tmp_path / "MNIST-dir0.5-rot4-nc4"
    for client in range(4):
        for part in ("train", "test"):
            (x, y), (xr, yr) = arrays(plain, part, client), arrays(rotated, part, client)
            assert np.array_equal(y, yr)                                   # same partition, same order
            assert np.array_equal(xr, np.rot90(x, client, axes=(2, 3)))    # client i: i x 90 degrees
    config = read_config(rotated)
    assert (config["feature_groups"], config["feature_shift"]) == (4, "rotation")
    assert config["train_samples"] == read_config(plain)["train_samples"]
    capsys.readouterr()
    code, out = generate("MNIST", mnist, tmp_path, "MNIST-dir0.5-rot4-nc4", *split, "--feature-groups", "4",
                         capsys=capsys)
    assert code == 0 and "already holds this split" in out
    before = (rotated / "config.json").read_bytes()
    code, out = generate("MNIST", mnist, tmp_path, "MNIST-dir0.5-rot4-nc4", *split, "--feature-groups", "4",
                         "--feature-shift", "corruption", capsys=capsys)
    assert_one_line(code, out, "holds another split", "feature_shift 'rotation' (asked 'corruption')", "--force")
    assert (rotated / "config.json").read_bytes() == before


def test_corrupted_cifar10_keeps_group_0_draws_noise_per_client_and_composes_with_label_groups(cifar10, tmp_path):
    split = ["iid", "-", "-", "--num-clients", "4", "--label-groups", "2"]
    shift = ["--feature-groups", "4", "--feature-shift", "corruption"]
    assert generate("Cifar10", cifar10, tmp_path, "plain", *split)[0] == 0
    assert generate("Cifar10", cifar10, tmp_path, "cor4", *split, *shift)[0] == 0
    assert generate("Cifar10", cifar10, tmp_path, "again", *split, *shift)[0] == 0
    plain, shifted = tmp_path / "plain", tmp_path / "cor4"
    config = read_config(shifted)
    assert config["corruptions"] == "none,gaussian_noise,gaussian_blur,contrast"
    assert (config["corruption_severity"], config["label_groups"]) == (3, 2)
    assert config["content_sha256"] == read_config(tmp_path / "again")["content_sha256"]  # same bytes
    noise = np.random.default_rng([config["seed"], NOISE_STREAM, 1])  # client 1's stream: train, then test
    for part in ("train", "test"):
        (x0, y0), (s0, t0) = arrays(plain, part, 0), arrays(shifted, part, 0)
        assert np.array_equal(x0, s0) and np.array_equal(y0, t0)    # group 0 untouched, to the byte
        (x1, y1), (s1, t1) = arrays(plain, part, 1), arrays(shifted, part, 1)
        assert np.array_equal(y1, t1)                                # label group 1's map, as unshifted
        assert np.array_equal(s1, pixels_to_floats(gaussian_noise(floats_to_pixels(x1), 3, noise)))
        (x2, _), (s2, _) = arrays(plain, part, 2), arrays(shifted, part, 2)
        assert np.array_equal(s2, pixels_to_floats(gaussian_blur(floats_to_pixels(x2), 3)))
        assert not np.array_equal(arrays(plain, part, 3)[0], arrays(shifted, part, 3)[0])


def test_stored_floats_and_pixels_convert_both_ways_exactly():
    pixels = np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1)
    stored = images_to_float(pixels)
    assert np.array_equal(floats_to_pixels(stored), pixels.transpose(0, 3, 1, 2))
    assert np.array_equal(pixels_to_floats(floats_to_pixels(stored)), stored)


# ----- refusals ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flags,message", [
    (["--feature-groups", "0"], "--feature-groups must be between 1 and --num-clients (8), got 0"),
    (["--feature-groups", "9"], "--feature-groups must be between 1 and --num-clients (8), got 9"),
    (["--feature-groups", "two"], "--feature-groups must be a whole number, got 'two'"),
    (["--feature-groups", "5"], "rotation has 4 distinct quarter turns, so --feature-groups must be at most 4"),
    (["--feature-groups", "2", "--feature-shift", "mirror"], "--feature-shift must be one of rotation, corruption"),
    (["--feature-shift", "corruption"], "--feature-shift needs --feature-groups G >= 2"),
    (["--feature-groups", "2", "--severity", "2"], "--severity applies to --feature-shift corruption only"),
    (["--feature-groups", "2", "--feature-shift", "corruption", "--severity", "6"],
     "--severity must be one of 1, 2, 3, 4, 5, got 6"),
    (["--feature-groups", "2", "--feature-shift", "corruption", "--corruptions", "none,fog"],
     "unknown corruption 'fog'"),
    (["--feature-groups", "3", "--feature-shift", "corruption", "--corruptions", "none,jpeg"],
     "--corruptions names 2 corruptions for --feature-groups 3"),
    (["--feature-groups", "8", "--feature-shift", "corruption"], "the default list has 7"),
])
def test_a_bad_feature_shift_is_one_line_and_writes_nothing(tmp_path, capsys, flags, message):
    def never_read(source, raw_dir):
        raise AssertionError("the data was read")
    code = generate_main("MNIST", never_read, ["iid", "-", "-", "--num-clients", "8", *flags, "--root", str(tmp_path)])
    assert_one_line(code, capsys.readouterr().out, message)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("shape,flags,message", [
    ((28, 20), ["--feature-groups", "2"], "rotation needs square images; these are 28x20"),
    ((8, 8, 4), ["--feature-groups", "2", "--feature-shift", "corruption", "--corruptions", "none,jpeg"],
     "x must hold uint8 images, N x H x W (grey) or N x H x W x 3 (RGB)"),  # refused as a source first
])
def test_images_a_shift_cannot_take_are_refused_before_anything_is_written(tmp_path, capsys, shape, flags, message):
    source = tmp_path / "odd.npz"
    np.savez(source, x=np.zeros((40, *shape), np.uint8), y=np.arange(40) % 2)
    code = generate_main("MNIST", torchvision_loader("MNIST"),
                         ["iid", "-", "-", "--num-clients", "2", *flags, "--source", str(source),
                          "--root", str(tmp_path / "data")])
    assert_one_line(code, capsys.readouterr().out, message)
    assert not (tmp_path / "data" / "MNIST").exists()


@pytest.mark.parametrize("generator,what", [(generate_AGNews, "AGNews holds texts, not images"),
                                            (generate_HAR, "HAR holds sensor windows, not images")])
def test_generators_of_other_data_refuse_a_feature_shift_before_reading(tmp_path, capsys, generator, what):
    code = generator.main(["--feature-groups", "2", "--root", str(tmp_path)])   # no --source: nothing downloaded
    assert_one_line(code, capsys.readouterr().out, what)
    assert list(tmp_path.iterdir()) == []


def test_femnist_writers_rotate_by_client_group(tmp_path):
    rng = np.random.default_rng(0)
    users = {f"w{k}": {"x": (rng.integers(0, 256, (6, 784)) / 255).tolist(), "y": [0, 1, 2, 3, 4, 5]}
             for k in range(3)}
    source = tmp_path / "femnist.json"
    source.write_text(json.dumps({"users": list(users), "user_data": users}))
    flags = ["--source", str(source), "--root", str(tmp_path)]
    assert generate_FEMNIST.main([*flags, "--name", "plain"]) == 0
    assert generate_FEMNIST.main([*flags, "--name", "rot2", "--feature-groups", "2"]) == 0
    for client, turns in ((0, 0), (1, 1), (2, 0)):
        assert np.array_equal(arrays(tmp_path / "rot2", "train", client)[0],
                              np.rot90(arrays(tmp_path / "plain", "train", client)[0], turns, axes=(2, 3)))


# ----- names, hints, the embedded Digits -------------------------------------------------------------------
def test_a_config_without_the_shift_fields_is_the_unshifted_split_and_a_shift_is_a_difference():
    plain = PartitionOptions()
    config = {key: value for key, value in asdict(plain).items() if key not in SHIFT_FIELDS}
    assert split_differences(config, plain) == []
    assert split_differences(config, replace(plain, feature_groups=4)) == ["feature_groups 1 (asked 4)"]


@pytest.mark.parametrize("options,name", [
    (PartitionOptions(feature_groups=4), "MNIST-rot4"),
    (PartitionOptions(partition="dir", alpha=0.5, feature_groups=2, num_clients=10), "MNIST-dir0.5-rot2-nc10"),
    (PartitionOptions(non_iid=False, partition="iid", label_groups=2, feature_groups=4, feature_shift="corruption",
                      corruptions="none,gaussian_noise,gaussian_blur,contrast"), "MNIST-iid-lg2-cor4"),
    (PartitionOptions(non_iid=False, partition="iid", feature_groups=3, feature_shift="corruption",
                      corruption_severity=5, corruptions="none,gaussian_blur,jpeg"), "MNIST-iid-cor3s5+none+blur+jpeg"),
])
def test_folder_names_spell_the_shift_and_read_back_to_the_same_split(options, name):
    assert folder_suggestion("MNIST", options, PartitionOptions()) == name
    read = split_from_name(name, 20)
    assert {key: getattr(options, key) for key in read} == read
    fields = asdict(options)
    assert feature_shift_from_word(feature_shift_word(fields)) == {key: fields[key] for key in SHIFT_FIELDS}


def test_a_missing_shifted_dataset_names_the_exact_command(tmp_path, capsys):
    assert generate_command("MNIST-iid-rot4", 20, tmp_path).startswith(
        "python dataset/generate_MNIST.py iid - - --num-clients 20 --feature-groups 4 --name MNIST-iid-rot4 --root ")
    assert ("--feature-groups 3 --feature-shift corruption --severity 5 --corruptions none,gaussian_blur,jpeg "
            "--name Cifar10-dir0.1-cor3s5+none+blur+jpeg") in generate_command("Cifar10-dir0.1-cor3s5+none+blur+jpeg", 20)
    code = main.main(["-data", "MNIST-iid-rot4", "-nc", "4", "--data_dir", str(tmp_path), "--results_dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "--num-clients 4 --feature-groups 4 --name MNIST-iid-rot4" in err
    assert "error: dataset 'MNIST-iid-rot4' not found" in err


def test_embedded_digits_builds_a_shifted_split_from_its_name(tmp_path):
    from app.build import prepare
    from app.options import parse_args
    for name in ("Digits-dir0.5", "Digits-dir0.5-rot2", "Digits-dir0.5-cor2s5"):
        prepare(parse_args(["-data", name, "-nc", "4", "-dev", "cpu", "--data_dir", str(tmp_path),
                            "--results_dir", str(tmp_path)]))
    # Named without a count, -nc 4 reads (and builds) the folder that names it, as a grid does.
    plain, rotated, noisy = (tmp_path / f"{n}-nc4" for n in ("Digits-dir0.5", "Digits-dir0.5-rot2", "Digits-dir0.5-cor2s5"))
    assert read_config(rotated)["feature_groups"] == 2 and read_config(noisy)["corruption_severity"] == 5
    assert np.array_equal(arrays(rotated, "train", 3)[0], np.rot90(arrays(plain, "train", 3)[0], 1, axes=(2, 3)))
    assert np.array_equal(arrays(noisy, "test", 2)[0], arrays(plain, "test", 2)[0])
    assert not np.array_equal(arrays(noisy, "test", 1)[0], arrays(plain, "test", 1)[0])


def test_the_digits_generator_suggests_the_shifted_folder_name(tmp_path, capsys):
    assert generate_main("Digits", generate_Digits.load_raw, ["iid", "-", "-", "--feature-groups", "4",
                                                              "--root", str(tmp_path)],
                         defaults=generate_Digits.DIGITS_DEFAULT, folder_for=generate_Digits.folder_for) == 2
    assert "--name Digits-iid-rot4" in capsys.readouterr().out
