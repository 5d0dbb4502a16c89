"""Client data: read once, batched by permutation, checked; clear errors for bad datasets."""
import json
import shutil

import numpy as np
import pytest
import torch

from utils.client_data import ClientData, load_client_data

from utils.datasets import DatasetError, dataset_info
def test_train_batches_visit_each_sample_once_per_epoch_and_drop_the_remainder():
    data = ClientData(torch.arange(23, dtype=torch.float32).view(23, 1, 1, 1), torch.arange(23))
    batches = list(data.train_batches(5, torch.Generator().manual_seed(0)))
    assert [len(y) for _, y in batches] == [5, 5, 5, 5]
    seen = torch.cat([y for _, y in batches])
    assert len(set(seen.tolist())) == 20
    assert all(torch.equal(x.view(-1).long(), y) for x, y in batches)  # x and y stay paired


def test_a_client_smaller_than_a_batch_trains_on_everything():
    data = ClientData(torch.zeros(3, 1, 1, 1), torch.arange(3))
    batches = list(data.train_batches(10, torch.Generator().manual_seed(0)))
    assert len(batches) == 1 and len(batches[0][1]) == 3


def test_few_shot_keeps_the_first_k_per_label(data_dir):
    info = dataset_info("Toy", 6, data_dir)
    full = load_client_data(info, 0, "train", torch.device("cpu"), num_classes=4)
    few = load_client_data(info, 0, "train", torch.device("cpu"), num_classes=4, few_shot=2)
    labels = full.y.numpy()
    expected = np.concatenate([np.flatnonzero(labels == k)[:2] for k in np.unique(labels)])
    assert sorted(few.y.tolist()) == sorted(labels[expected].tolist())
    assert all(c <= 2 for c in np.bincount(few.y.numpy()))


def test_missing_dataset_names_the_generate_command(tmp_path):
    with pytest.raises(DatasetError, match=r"python dataset/generate_MNIST.py noniid - dir --num-clients 20"):
        dataset_info("MNIST", 20, tmp_path)


def test_too_few_clients_is_refused(data_dir):
    with pytest.raises(DatasetError, match="has 6 clients but 10 are needed"):
        dataset_info("Toy", 10, data_dir)


def test_labels_outside_the_class_count_are_refused(data_dir):
    info = dataset_info("Toy", 6, data_dir)
    with pytest.raises(DatasetError, match=r"labels span \[0, \d\] but the model has 2 classes; raise -ncl"):
        load_client_data(info, 0, "train", torch.device("cpu"), num_classes=2)


def test_pfllib_config_without_shapes_is_read_from_the_files(data_dir, tmp_path):
    root = tmp_path / "Legacy"
    shutil.copytree(data_dir / "Toy", root)
    config = json.loads((root / "config.json").read_text())
    for key in ("input_shape", "train_samples", "test_samples", "num_classes"):
        config.pop(key)
    (root / "config.json").write_text(json.dumps(config))
    info = dataset_info("Legacy", 6, tmp_path)
    assert info.input_shape == (1, 8, 8) and info.num_classes == 4
    assert sum(info.train_samples) + sum(info.test_samples) == 480
