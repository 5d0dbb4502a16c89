"""Bad input: a clear one-line error and a non-zero exit, never a traceback from deep inside."""
import shutil

import numpy as np
import pytest

import main
from dataset.utils.client_files import read_client_arrays, write_client_arrays
from dataset.utils.generate import PartitionOptions, build_dataset
from helpers import cli


def run_main(argv, capsys):
    code = main.main(argv)
    err = capsys.readouterr().err
    return code, err


def assert_one_line_error(code, err, *fragments):
    assert code == 2
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err


@pytest.fixture
def own_data(data_dir, tmp_path):
    """A private copy of the Toy data that a test may damage."""
    shutil.copytree(data_dir / "Toy", tmp_path / "data" / "Toy")
    return tmp_path / "data"


def test_missing_dataset_prints_the_generate_command(tmp_path, capsys):
    code, err = run_main(["-data", "MNIST", "-gr", "0", "-dev", "cpu", "--data_dir", str(tmp_path)], capsys)
    assert_one_line_error(code, err, "python dataset/generate_MNIST.py noniid - dir --num-clients 20")


def test_dataset_with_fewer_clients_than_nc(data_dir, tmp_path, capsys):
    code, err = run_main(cli(data_dir, tmp_path, "-nc", "9"), capsys)
    assert_one_line_error(code, err, "has 6 clients but 9 are needed")


def test_truncated_client_file(own_data, tmp_path, capsys):
    target = own_data / "Toy" / "train" / "3.npz"
    target.write_bytes(target.read_bytes()[:200])
    code, err = run_main(cli(own_data, tmp_path), capsys)
    assert_one_line_error(code, err, "train/3.npz", "truncated or corrupt", "regenerate")


def test_labels_outside_the_class_count(own_data, tmp_path, capsys):
    path = own_data / "Toy" / "train" / "2.npz"
    x, y = read_client_arrays(path)
    y[0] = 9  # the config says 4 classes
    write_client_arrays(path, x, y)
    code, err = run_main(cli(own_data, tmp_path), capsys)
    assert_one_line_error(code, err, "labels span", "raise -ncl to at least 10")


def test_model_that_cannot_take_the_input_shape(tmp_path, capsys):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 1, 1, 1)).astype(np.float32)
    build_dataset(tmp_path / "data" / "Tiny", x, np.arange(120) % 2, PartitionOptions(num_clients=2, min_samples=10))
    code, err = run_main(["-data", "Tiny", "-nc", "2", "-m", "CNN", "-gr", "0", "-dev", "cpu",
                          "--data_dir", str(tmp_path / "data"), "--results_dir", str(tmp_path)], capsys)
    assert_one_line_error(code, err, "model CNN cannot take inputs of shape (1, 1, 1)")


def test_diverging_training_names_round_client_and_flag(data_dir, tmp_path, capsys):
    code, err = run_main(cli(data_dir, tmp_path, "-lr", "1e30"), capsys)
    assert_one_line_error(code, err, "round 0: client", "non-finite loss", "lower -lr")


@pytest.mark.parametrize("argv,fragment", [(["-jr", "0"], "-jr/--join_ratio must be in (0, 1]"),
                                           (["-gr", "-5"], "-gr/--global_rounds must be >= 0")])
def test_out_of_range_flags_exit_before_any_work(argv, fragment, capsys):
    with pytest.raises(SystemExit) as stop:
        main.main(argv)
    assert stop.value.code == 2 and fragment in capsys.readouterr().err


def test_unknown_device(data_dir, tmp_path, capsys):
    code, err = run_main(cli(data_dir, tmp_path, "-dev", "tpu"), capsys)
    assert_one_line_error(code, err, "unknown device 'tpu'; use cpu, cuda")


def test_any_user_error_is_one_line_and_anything_else_keeps_its_traceback(monkeypatch, capsys):
    from utils.errors import UserError

    class NewKindOfMistake(UserError):   # a future error class needs nothing but the base
        pass

    def fail_with(error):
        def run(*args):
            raise error
        return run
    monkeypatch.setattr(main, "run", fail_with(NewKindOfMistake("-x must be positive")))
    assert_one_line_error(*run_main(["-gr", "0"], capsys), "-x must be positive")
    monkeypatch.setattr(main, "run", fail_with(ValueError("a bug")))
    with pytest.raises(ValueError, match="a bug"):
        main.main(["-gr", "0"])


@pytest.mark.parametrize("flags, fragment", [
    (["-data", "Digits", "-nc", "100000"], "cannot split Digits (1797 images) into 100000 clients as 'Digits' asks: "
                                           "1797 samples cannot be split over 100000 clients; lower -nc"),
    (["-data", "Digits-pat11"], "as 'Digits-pat11' asks: --class-per-client must be in [1, 10], got 11"),
    (["-data", "Digits-dir0"], "as 'Digits-dir0' asks: --alpha must be a positive number, got 0.0"),
    (["-data", "Digits", "--full-disk"], "cannot write {data}/Digits (No space left on device); free space there or "
                                         "pass another --data_dir"),
], ids=["more-clients-than-images", "more-classes-per-client-than-classes", "alpha-0", "full-disk"])
def test_every_error_of_building_the_default_dataset_on_first_use_is_one_line(flags, fragment, tmp_path, capsys,
                                                                           monkeypatch):
    import errno
    import os
    import dataset.utils.generate as generate
    if "--full-disk" in flags:
        flags.remove("--full-disk")

        def disk_full(*args):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        monkeypatch.setattr(generate, "write_client_arrays", disk_full)
    data = tmp_path / "data"
    code, err = run_main([*flags, "-gr", "0", "-dev", "cpu", "--data_dir", str(data), "--results_dir", str(tmp_path)],
                         capsys)
    assert_one_line_error(code, err, fragment.format(data=data))
    assert not data.exists() or not list(data.iterdir())  # no folder, whole or half built
