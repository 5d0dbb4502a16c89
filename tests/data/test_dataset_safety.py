"""Datasets and paths that lose nothing: whole-folder rebuilds, files checked against config.json,
one-line errors for damaged files, umask-following modes, names that stay inside their folders."""
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

import main
from helpers import REPO, cli, make_images
from dataset.generate_Digits import DIGITS_DEFAULT
from dataset.utils.atomic_io import atomic_path
from dataset.utils.client_files import DatasetFileError, read_client_arrays, read_config, write_client_arrays
from dataset.utils.command_line import main as generate_main
from dataset.utils.generate import PartitionOptions, build_dataset
from app.build import prepare
from app.options import parse_args
from utils.client_data import load_client_data
from utils.datasets import DatasetError, dataset_info
from utils.result_utils import write_results

CPU = torch.device("cpu")


def run_main(argv, capsys):
    code = main.main(argv)
    return code, capsys.readouterr().err


def assert_one_line_error(code, err, *fragments):
    assert code == 2, err
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in err, err


def tree(folder: Path) -> dict:
    """Relative path -> bytes of every file under ``folder``."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def toy_loader(n=480, seed=0):
    """A generator's raw loader (``(source, raw_dir) -> (x, y)``) over small synthetic images."""
    x, y = make_images(n, seed=seed)
    return lambda source, raw_dir: (x, y)


@pytest.fixture
def own_data(data_dir, tmp_path):
    """A private copy of the Toy data that a test may damage."""
    shutil.copytree(data_dir / "Toy", tmp_path / "data" / "Toy")
    return tmp_path / "data"


def edit_config(root: Path, **changes):
    config = json.loads((root / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (root / "config.json").write_text(json.dumps(config))


# ----- 1. rebuilding a folder never mixes two partitions ---------------------------------------------
def test_another_split_is_refused_without_force_and_replaced_whole_with_it(tmp_path, capsys):
    common = ["noniid", "-", "dir", "--alpha", "0.5", "--min-samples", "10", "--root", str(tmp_path), "--name", "Toy"]
    assert generate_main("MNIST", toy_loader(), [*common, "--num-clients", "6"]) == 0
    folder = tmp_path / "Toy"
    before = tree(folder)
    (folder / "rawdata").mkdir()
    (folder / "rawdata" / "download.bin").write_bytes(b"raw")

    assert generate_main("MNIST", toy_loader(), [*common, "--num-clients", "4"]) == 2
    out = capsys.readouterr().out
    assert "holds another split (num_clients 6 (asked 4))" in out and "--force" in out
    assert {k: v for k, v in tree(folder).items() if not k.startswith("rawdata")} == before

    assert generate_main("MNIST", toy_loader(), [*common, "--num-clients", "4", "--force"]) == 0
    assert sorted(p.name for p in (folder / "train").iterdir()) == ["0.npz", "1.npz", "2.npz", "3.npz"]
    assert read_config(folder)["num_clients"] == 4
    assert (folder / "rawdata" / "download.bin").read_bytes() == b"raw"  # downloads survive a rebuild
    assert [p.name for p in tmp_path.iterdir()] == ["Toy"]  # no temporary folder left behind


def test_a_killed_rebuild_leaves_the_old_folder_untouched(tmp_path):
    rng = np.random.default_rng(0)
    source = tmp_path / "src.npz"
    np.savez(source, x=rng.integers(0, 255, size=(24000, 8, 8), dtype=np.uint8), y=np.arange(24000) % 10)
    script = str(REPO / "dataset" / "generate_MNIST.py")
    base = [sys.executable, script, "iid", "-", "-", "--source", str(source), "--root", str(tmp_path),
            "--name", "Big"]
    subprocess.run([*base, "--num-clients", "3"], check=True, capture_output=True, timeout=60)
    folder = tmp_path / "Big"
    before = tree(folder)

    rebuild = subprocess.Popen([*base, "--num-clients", "1200", "--force"], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and rebuild.poll() is None:
        # New files exist somewhere (beside the folder after the fix, inside it before): kill mid-build.
        if len(list(tmp_path.glob("*/train/*.npz"))) > 3 + 20:
            break
        time.sleep(0.002)
    assert rebuild.poll() is None, "the rebuild finished before it could be interrupted"
    os.kill(rebuild.pid, signal.SIGKILL)
    rebuild.wait()
    after = tree(folder)
    assert sorted(after) == sorted(before)
    assert [name for name in before if after[name] != before[name]] == []


def twin_datasets(tmp_path):
    """Two IID balanced builds with equal client sizes but different samples (partition seeds 1, 2)."""
    x, y = make_images(480)
    for seed, name in ((1, "A"), (2, "B")):
        build_dataset(tmp_path / name, x, y, PartitionOptions(num_clients=4, non_iid=False, balance=True,
                                                              partition="iid", seed=seed), source="")
    return tmp_path / "A", tmp_path / "B"


def test_a_file_from_another_build_with_the_same_count_is_refused_by_its_hash(tmp_path):
    a, b = twin_datasets(tmp_path)
    assert len(read_client_arrays(a / "train" / "1.npz")[1]) == len(read_client_arrays(b / "train" / "1.npz")[1])
    shutil.copy(b / "train" / "1.npz", a / "train" / "1.npz")
    info = dataset_info("A", 4, tmp_path)
    load_client_data(info, 0, "train", CPU, num_classes=4)  # the others still load
    with pytest.raises(DatasetError, match=r"A/train/1.npz is not the file the generator wrote .*regenerate it with"):
        load_client_data(info, 1, "train", CPU, num_classes=4)


def test_old_folders_without_hashes_load_and_get_the_count_check(own_data):
    edit_config(own_data / "Toy", content_sha256=None)
    info = dataset_info("Toy", 6, own_data)
    for i in range(6):
        load_client_data(info, i, "train", CPU, num_classes=4)  # an intact old folder loads
    sizes = info.train_samples
    other = next(i for i in range(1, 6) if sizes[i] != sizes[0])
    shutil.copy(own_data / "Toy" / "train" / f"{other}.npz", own_data / "Toy" / "train" / "0.npz")
    with pytest.raises(DatasetError, match=rf"train/0.npz holds {sizes[other]} samples but .*config.json says "
                                           rf"{sizes[0]}: the folder mixes files"):
        load_client_data(info, 0, "train", CPU, num_classes=4)


def test_run_all_names_the_folder_by_its_client_count(tmp_path):
    def plan(*flags):
        env = dict(os.environ, PYTHON=sys.executable)
        done = subprocess.run(["bash", str(REPO / "run_all.sh"), "-a", "FedAvg", "-d", "Digits", "-p", "dir0.1",
                               "-m", "DNN", "--dry-run", "--results_dir", str(tmp_path), *flags],
                              capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout
    assert "-data Digits-dir0.1-nc10 " in plan("-c", "10")
    assert "-data Digits-dir0.1 " in plan("-c", "20")   # the default count keeps the earlier name


# ----- 6. the embedded Digits folder does not depend on the first command's -nc ---------------------
def test_digits_default_folder_is_always_the_documented_split(tmp_path, capsys):
    data = tmp_path / "data"
    flags = ["-dev", "cpu", "--data_dir", str(data), "--results_dir", str(tmp_path)]
    args, _ = prepare(parse_args(["-nc", "5", *flags]))
    assert read_config(data / "Digits-nc5")["num_clients"] == 5
    assert not (data / "Digits").exists()
    args, _ = prepare(parse_args(flags))   # the quickstart after a -nc 5 run
    config = read_config(data / "Digits")
    assert {k: config[k] for k in asdict(DIGITS_DEFAULT)} == asdict(DIGITS_DEFAULT)
    assert args.num_classes == 10

    # A Digits folder holding something else is refused with the command that restores the default.
    edit_config(data / "Digits", alpha=0.5)
    code, err = run_main(["-gr", "0", *flags], capsys)
    assert_one_line_error(code, err, "holds another split than the default Digits one (alpha 0.5 (asked 0.1))",
                          f"python dataset/generate_Digits.py noniid - dir --num-clients 20 --alpha 0.1 "
                          f"--min-samples 20 --root {data} --force")


# ----- 7. a grid entry listed twice runs once ------------------------------------------------------
def test_duplicate_grid_entries_run_once(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable)
    done = subprocess.run(["bash", str(REPO / "run_all.sh"), "-a", "FedAvg FedAvg,FedLAG", "-d", "Digits Digits",
                           "-p", "dir0.1 dir0.1", "-s", "0 0-1 01", "-m", "DNN", "--dry-run",
                           "--results_dir", str(tmp_path)], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    runs = [line for line in done.stdout.splitlines() if line.startswith("    python")]
    assert len(runs) == len(set(runs)) == 4   # 2 algorithms x 2 seeds
    assert "4 runs = 2 algorithms x 1 dataset folders x 1 models x 2 seeds" in done.stdout


# ----- 11. damaged files and flags: one line naming the file ---------------------------------------
@pytest.mark.parametrize("content,fragment", [
    ("[1, 2, 3]", "config.json holds a JSON list, expected an object"),
    ('{"num_clients": "six", "num_classes": 4}', "num_clients is 'six', expected a positive whole number"),
    ('{"num_clients": 2.5, "num_classes": 4}', "num_clients is 2.5, expected a positive whole number"),
])
def test_malformed_config_is_one_line_naming_the_file(own_data, tmp_path, capsys, content, fragment):
    (own_data / "Toy" / "config.json").write_text(content)
    code, err = run_main(cli(own_data, tmp_path), capsys)
    assert_one_line_error(code, err, "Toy/config.json", fragment, "regenerate it with")


def npz_with_header(path: Path, shape, payload: bytes = b"\0" * 64):
    """An .npz whose member x.npy declares ``shape`` (float32) but holds only ``payload``."""
    member = io.BytesIO()
    np.lib.format.write_array_header_1_0(member, {"descr": "<f4", "fortran_order": False, "shape": shape})
    member.write(payload)
    y = io.BytesIO()
    np.lib.format.write_array(y, np.zeros(2, np.int64))
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", member.getvalue())
        archive.writestr("y.npy", y.getvalue())


def test_a_header_claiming_a_huge_array_is_refused_before_allocating(own_data, tmp_path, capsys):
    target = own_data / "Toy" / "train" / "1.npz"
    npz_with_header(target, (10 ** 14, 1, 8, 8))
    with pytest.raises(DatasetFileError, match=r"claims an array of shape \(100000000000000, 1, 8, 8\)"):
        read_client_arrays(target)
    code, err = run_main(cli(own_data, tmp_path), capsys)  # the config bounds it before the file's size does
    assert_one_line_error(code, err, "train/1.npz", "more than config.json allows it", "regenerate it with")


def test_data_dir_that_is_a_file(tmp_path, capsys):
    a_file = tmp_path / "data.txt"
    a_file.write_text("not a folder")
    code, err = run_main(["-gr", "0", "-dev", "cpu", "--data_dir", str(a_file), "--results_dir", str(tmp_path)],
                         capsys)
    assert_one_line_error(code, err, f"--data_dir {a_file} is a file, not a folder")


# ----- 12. suspicious contents: refused, or warned about ------------------------------------------
def test_num_classes_larger_than_the_labels_need_is_warned_about_once(own_data, capsys):
    edit_config(own_data / "Toy", num_classes=50)
    info = dataset_info("Toy", 6, own_data)
    dataset_info("Toy", 6, own_data)
    err = capsys.readouterr().err
    assert info.num_classes == 50
    assert err.count("warning: ") == 1 and "says num_classes 50 but no client's train labels go above 3" in err


def rewrite_client(folder: Path, split: str, client: int, change):
    path = folder / split / f"{client}.npz"
    x, y = read_client_arrays(path)
    write_client_arrays(path, *change(x.copy(), y.copy()))
    return path


@pytest.mark.parametrize("split", ["train", "test"])
def test_non_finite_inputs_are_refused_naming_the_file(own_data, split):
    def poison(x, y):
        x[1, 0, 2, 3] = np.nan
        x[2, 0, 0, 0] = np.inf
        return x, y
    rewrite_client(own_data / "Toy", split, 2, poison)
    info = dataset_info("Toy", 6, own_data)
    with pytest.raises(DatasetError, match=rf"Toy/{split}/2.npz: x holds 2 NaN or infinite values"):
        load_client_data(info, 2, split, CPU, num_classes=4)


@pytest.mark.parametrize("dtype", [np.float64, np.complex64])
def test_non_integer_labels_are_refused(own_data, dtype):
    rewrite_client(own_data / "Toy", "train", 0, lambda x, y: (x, y.astype(dtype) + dtype(0.5)))
    info = dataset_info("Toy", 6, own_data)
    with pytest.raises(DatasetError, match=rf"Toy/train/0.npz: labels y have dtype {np.dtype(dtype)}; they "
                                           rf"must be integers"):
        load_client_data(info, 0, "train", CPU, num_classes=4)


# ----- 13. messages that say exactly what to run ---------------------------------------------------
def test_regenerate_hint_is_the_exact_command_for_that_folder(tmp_path, capsys):
    x, y = make_images(480)
    options = PartitionOptions(num_clients=6, alpha=0.5, min_samples=20)
    build_dataset(tmp_path / "MNIST-dir0.5", x, y, options, source="MNIST")
    target = tmp_path / "MNIST-dir0.5" / "train" / "3.npz"
    target.write_bytes(target.read_bytes()[:200])
    code, err = run_main(["-data", "MNIST-dir0.5", "-nc", "6", "-m", "DNN", "-gr", "0", "-dev", "cpu",
                          "--data_dir", str(tmp_path), "--results_dir", str(tmp_path)], capsys)
    assert_one_line_error(code, err, "train/3.npz")
    command = err.strip().split("regenerate it with: ")[1]
    assert command == (f"python dataset/generate_MNIST.py noniid - dir --num-clients 6 --alpha 0.5 "
                       f"--min-samples 20 --name MNIST-dir0.5 --root {tmp_path} --force")
    assert err.count("; regenerate") == 1 and "regenerate the dataset" not in err   # said once


def test_a_negative_label_is_called_negative(own_data, tmp_path, capsys):
    def negative(x, y):
        y[0] = -1
        return x, y
    rewrite_client(own_data / "Toy", "train", 2, negative)
    code, err = run_main(cli(own_data, tmp_path), capsys)
    assert_one_line_error(code, err, "Toy/train/2.npz: label -1 is negative")
    assert "-ncl" not in err


# ----- 14. files follow the umask ----------------------------------------------------------------
@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_written_files_and_folders_follow_the_umask(tmp_path, umask_022):
    with atomic_path(tmp_path / "plain.txt") as tmp:
        Path(tmp).write_text("x")
    write_results(tmp_path / "run.h5", {"rs_test_acc": np.zeros(2)}, {"complete": True})
    x, y = make_images(120)
    build_dataset(tmp_path / "Data", x, y, PartitionOptions(num_clients=2, min_samples=10))
    files = [tmp_path / "plain.txt", tmp_path / "run.h5", tmp_path / "Data" / "config.json",
             tmp_path / "Data" / "train" / "0.npz"]
    assert {oct(f.stat().st_mode & 0o777) for f in files} == {oct(0o644)}
    assert oct((tmp_path / "Data").stat().st_mode & 0o777) == oct(0o755)
    os.umask(0o077)
    with atomic_path(tmp_path / "private.txt") as tmp:
        Path(tmp).write_text("x")
    assert (tmp_path / "private.txt").stat().st_mode & 0o777 == 0o600


# ----- 15. names that would leave their folder ---------------------------------------------------
@pytest.mark.parametrize("flag,value", [("-go", "../escape"), ("-go", "sub/dir"), ("-data", "../Toy"),
                                        ("-data", "..")])
def test_names_with_separators_or_dotdot_are_refused_before_loading(own_data, tmp_path, capsys, flag, value):
    results = tmp_path / "results"
    inner = own_data / "inner"   # "-data ../Toy" from here reaches the real Toy folder
    inner.mkdir()
    code, err = run_main([*cli(inner, results), "-gr", "0", flag, value], capsys)
    assert_one_line_error(code, err, f"{flag}", repr(value), "plain name")
    assert not list(tmp_path.rglob("*.h5")) and not list(tmp_path.rglob("*escape*"))


def test_the_generator_refuses_a_name_that_leaves_its_root(tmp_path, capsys):
    root = tmp_path / "root"
    assert generate_main("MNIST", toy_loader(), ["--root", str(root), "--name", "../outside"]) == 2
    assert "--name '../outside' must be a plain folder name" in capsys.readouterr().out
    assert not (tmp_path / "outside").exists()


# ----- concept shift (--label-groups) and embedded Digits splits named in run_all.sh's convention -----
def test_label_groups_permute_labels_per_group_and_change_nothing_else(tmp_path):
    from dataset.utils.generate import label_permutations
    x = np.arange(400, dtype=np.float32).reshape(400, 1, 1, 1)
    y = np.repeat(np.arange(10), 40)
    plain = build_dataset(tmp_path / "plain", x, y, PartitionOptions(num_clients=8, non_iid=False, partition="iid"))
    options = PartitionOptions(num_clients=8, non_iid=False, partition="iid", label_groups=3)
    shifted = build_dataset(tmp_path / "shift", x, y, options)
    maps = label_permutations(3, 10, options.seed)
    assert np.array_equal(maps[0], np.arange(10)) and not np.array_equal(maps[1], maps[2])
    assert all(sorted(m.tolist()) == list(range(10)) for m in maps)
    assert plain["train_samples"] == shifted["train_samples"] and shifted["label_groups"] == 3
    for i in range(8):
        for split in ("train", "test"):
            xa, ya = read_client_arrays(tmp_path / "plain" / split / f"{i}.npz")
            xb, yb = read_client_arrays(tmp_path / "shift" / split / f"{i}.npz")
            assert np.array_equal(xa, xb)                       # same images, same order
            assert np.array_equal(yb, maps[i % 3][ya])          # labels through the group's map
    # A config written before the option existed holds the default (no label shift): still this split.
    from dataset.utils.generate import split_differences
    config = read_config(tmp_path / "plain")
    config.pop("label_groups")
    assert split_differences(config, PartitionOptions(num_clients=8, non_iid=False, partition="iid")) == []


def test_embedded_digits_names_build_the_split_they_spell_and_typos_build_nothing(tmp_path, capsys):
    from utils.dataset_hints import generate_command
    from utils.datasets import embedded_split
    shifted = embedded_split("Digits-iid-lg4-nc40", 20)
    assert (shifted.partition, shifted.non_iid, shifted.label_groups, shifted.num_clients) == ("iid", False, 4, 40)
    assert embedded_split("Digits-dir0.5", 6).alpha == 0.5 and embedded_split("Digits", 20) == DIGITS_DEFAULT
    assert embedded_split("Digits-dri0.5", 6) is None and embedded_split("MNIST-iid", 6) is None
    assert "--label-groups 4" in generate_command("Digits-iid-lg4", 40)
    data = tmp_path / "data"
    flags = ["-dev", "cpu", "--data_dir", str(data), "--results_dir", str(tmp_path)]
    prepare(parse_args(["-data", "Digits-iid-lg2", "-nc", "6", *flags]))
    config = read_config(data / "Digits-iid-lg2-nc6")  # the folder a grid names for that split
    assert (config["num_clients"], config["partition"], config["label_groups"]) == (6, "iid", 2)
    code, err = run_main(["-data", "Digits-dri0.5", "-nc", "6", "-gr", "0", *flags], capsys)
    assert code == 2 and "not found" in err and not (data / "Digits-dri0.5").exists()
