"""An embedded Digits split has one folder per client count: ``-data Digits-iid-lg4 -nc 40`` (the
quickstart) and a grid's ``Digits-iid-lg4-nc40`` read the same files."""
import json

from utils.datasets import dataset_folder, ensure_default_dataset


def test_a_split_named_without_a_count_lives_in_the_counted_folder(tmp_path):
    assert dataset_folder("Digits-iid-lg4", 40, tmp_path) == tmp_path / "Digits-iid-lg4-nc40"
    assert dataset_folder("Digits-iid-lg4-nc40", 40, tmp_path) == tmp_path / "Digits-iid-lg4-nc40"
    # The default count keeps the bare name, as Digits itself does; other datasets are read as named.
    assert dataset_folder("Digits-iid-lg4", 20, tmp_path) == tmp_path / "Digits-iid-lg4"
    assert dataset_folder("Digits", 8, tmp_path) == tmp_path / "Digits-nc8"
    assert dataset_folder("MNIST-dir0.1", 40, tmp_path) == tmp_path / "MNIST-dir0.1"
    assert dataset_folder("Digits-custom", 40, tmp_path) == tmp_path / "Digits-custom"  # not a partition


def test_the_quickstart_and_the_grid_build_one_folder(tmp_path):
    built = ensure_default_dataset("Digits-iid-lg4", 40, tmp_path)
    assert built == tmp_path / "Digits-iid-lg4-nc40"
    assert ensure_default_dataset("Digits-iid-lg4-nc40", 40, tmp_path) is None  # there already
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Digits-iid-lg4-nc40"]


def test_a_folder_built_before_under_the_bare_name_is_still_read(tmp_path):
    old = tmp_path / "Digits-iid-lg4"
    old.mkdir()
    (old / "config.json").write_text(json.dumps({"num_clients": 40}))
    assert dataset_folder("Digits-iid-lg4", 40, tmp_path) == old
    assert dataset_folder("Digits-iid-lg4", 10, tmp_path) == tmp_path / "Digits-iid-lg4-nc10"  # another count
