"""The fixtures (small datasets built in temporary folders, a local Ray) and the collection order; the
helpers the tests share are in ``helpers.py``."""
from __future__ import annotations

from pathlib import Path

import pytest

from dataset.utils.generate import PartitionOptions, build_dataset
from helpers import make_images


def pytest_collection_modifyitems(items):
    """Tests that must share one worker of a parallel run (``xdist_group``: those that start Ray) come
    first. Together they are the longest unit of work, so starting it first lets the other workers take
    everything else instead of waiting for it at the end. The sort is stable, and the same in every
    worker, as pytest-xdist requires."""
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)


@pytest.fixture(autouse=True)
def one_free_core(monkeypatch):
    """Runs see a machine with one free core, so ``--executor auto`` stays in one process whatever else the
    machine (or pytest's other workers) happens to be doing; tests of worker processes ask for them."""
    import app.run
    from app.cores import Cores
    monkeypatch.setattr(app.run, "machine_cores", lambda: Cores(1, 0.0))


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray for the module's tests (skipped where Ray is not installed); shut down if started here."""
    ray = pytest.importorskip("ray")
    from flcore.executors.ray_cluster import start_ray
    started = start_ray()
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """A folder with 'Toy' (6 clients, 4 classes, 8x8) and 'Toy3' (4 clients, RGB 32x32)."""
    root = tmp_path_factory.mktemp("data")
    x, y = make_images(480)
    build_dataset(root / "Toy", x, y, PartitionOptions(num_clients=6, partition="dir", alpha=0.5, min_samples=20))
    x, y = make_images(160, shape=(3, 32, 32), num_classes=3)
    build_dataset(root / "Toy3", x, y, PartitionOptions(num_clients=4, partition="dir", alpha=1.0, min_samples=20))
    return root


@pytest.fixture(scope="session")
def digits_groups_dir(tmp_path_factory) -> Path:
    """A folder where the embedded Digits is split on first use, e.g. into Digits-iid-lg4 (client i in the
    label group i % 4)."""
    return tmp_path_factory.mktemp("digits-groups")
