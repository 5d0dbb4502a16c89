"""A generator on a full disk: one line, exit status 2, no dataset folder and no temporary one left."""
import errno
import os
import resource
import subprocess
import sys

import numpy as np
import pytest

import dataset.utils.generate as generate
from dataset import generate_Digit5, generate_HAR
from test_sensor_data import write_har_release
from test_source_files import run_generator
from helpers import REPO, full_disk_from

NO_SPACE = os.strerror(errno.ENOSPC)


def write_images_source(path, n=200, shape=(8, 8)):
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.integers(0, 255, size=(n, *shape), dtype=np.uint8), y=np.arange(n) % 10)
    return path


def mnist(tmp_path, capsys, root):
    source = write_images_source(tmp_path / "mnist.npz")
    return run_generator("MNIST", ["--source", str(source), "--num-clients", "4", "--root", str(root)], capsys)


def har(tmp_path, capsys, root):
    source = write_har_release(tmp_path / "UCI HAR Dataset")
    return generate_HAR.main(["--source", str(source), "--root", str(root)]), capsys.readouterr().out


def digit5(tmp_path, capsys, root):
    folder = tmp_path / "digit5"
    folder.mkdir()
    for domain in generate_Digit5.DOMAINS:
        write_images_source(folder / f"{domain}.npz", n=60)
    return generate_Digit5.main(["--source", str(folder), "--num-clients", "5", "--root", str(root)]), \
        capsys.readouterr().out


@pytest.mark.parametrize("write", ["a client file", "config.json"])
@pytest.mark.parametrize("generator", [mnist, har, digit5], ids=["MNIST", "HAR", "Digit5"])
def test_a_full_disk_part_way_through_a_build_is_one_line_and_leaves_nothing(generator, write, tmp_path, capsys,
                                                                            monkeypatch):
    if write == "a client file":
        monkeypatch.setattr(generate, "write_client_arrays", full_disk_from(3, generate.write_client_arrays))
    else:
        monkeypatch.setattr(generate, "write_config", full_disk_from(1, generate.write_config))
    root = tmp_path / "data"
    code, out = generator(tmp_path, capsys, root)
    lines = out.strip().splitlines()
    assert code == 2 and len(lines) == 1, out
    assert lines[0].startswith(f"error: cannot build the dataset: {NO_SPACE} (") and \
        lines[0].endswith("); nothing was left half-written"), lines[0]
    assert not root.exists() or [p.name for p in root.iterdir()] == []  # neither the folder nor a temporary one


def test_a_real_file_size_limit(tmp_path):
    """The kernel's own EFBIG part-way through the first client file (RLIMIT_FSIZE)."""
    source = write_images_source(tmp_path / "mnist.npz", n=400, shape=(28, 28))
    root = tmp_path / "data"

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, resource.RLIM_INFINITY))
    done = subprocess.run([sys.executable, str(REPO / "dataset" / "generate_MNIST.py"), "--source", str(source),
                           "--num-clients", "2", "--root", str(root)], capture_output=True, text=True, timeout=120,
                          preexec_fn=limit_file_size)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert done.stdout.startswith(f"error: cannot build the dataset: {os.strerror(errno.EFBIG)}") and \
        len(done.stdout.splitlines()) == 1, done.stdout
    assert not root.exists() or [p.name for p in root.iterdir()] == []
