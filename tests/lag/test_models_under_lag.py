"""Every model of PFLlib's zoo runs ``-algo FedLAG`` and ``-algo FedRep+LAG`` end to end from a dataset
folder of its input kind (images, sensor windows, feature vectors, token ids): two evaluations in the
``.h5``, LAG layers named by the model's modules, and FedRep+LAG choosing among the body only.

The data are tiny and synthetic (2 clients, 16x16 images, 12-token texts). ResNet34 is ResNet10's builder
with more blocks and costs a second per minibatch on one CPU core even here: it is left to the forward,
backward and split tests of ``test_model_zoo.py``.
"""
import numpy as np
import pytest

import main
from dataset.utils.client_files import TOKEN_INPUTS, VECTOR_INPUTS
from dataset.utils.generate import PartitionOptions, build_dataset
from dataset.utils.text import token_inputs
from flcore.trainmodel.models import MODELS, TEXT_MODELS, build_model
from utils.result_utils import read_results

CLIENTS, CLASSES, VOCAB, LENGTH = 2, 3, 50, 12
# The dataset each model reads: its folder, and one sample's shape.
IMAGES, SENSOR, VECTORS, TEXTS = "Img", "Sensor", "Vec", "Txt"
SAMPLES = {IMAGES: (3, 16, 16), SENSOR: (9, 1, 128), VECTORS: (64,), TEXTS: (LENGTH,)}
NEW_MODELS = ("CNN-BN", "LeNet", "AlexNet", "GoogleNet", "MobileNet", "ResNet10", "HARCNN", "AmazonMLP", *TEXT_MODELS)


def dataset_of(model: str) -> str:
    if model in TEXT_MODELS:
        return TEXTS
    return {"HARCNN": SENSOR, "AmazonMLP": VECTORS}.get(model, IMAGES)


@pytest.fixture(scope="module")
def zoo_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo")
    rng = np.random.default_rng(0)
    y = np.arange(72) % CLASSES
    options = PartitionOptions(num_clients=CLIENTS, partition="dir", alpha=1.0, min_samples=24)
    for name, shape in SAMPLES.items():
        if name == TEXTS:
            x = rng.integers(1, VOCAB, size=(len(y), LENGTH))
            x[:, 0] = y + 1  # the first token names the class
            extra = dict(token_inputs(VOCAB, LENGTH))
            assert extra["input_kind"] == TOKEN_INPUTS
        else:
            x = rng.normal(0, 0.5, size=(len(y), *shape)).astype(np.float32)
            x.reshape(len(y), -1)[np.arange(len(y)), y] += 3.0  # one feature per class
            extra = {"input_kind": VECTOR_INPUTS} if name == VECTORS else {}
        build_dataset(root / name, x, y, options, extra_config=extra)
    return root


@pytest.mark.parametrize("algorithm", ["FedLAG", "FedRep+LAG"])
@pytest.mark.parametrize("model", NEW_MODELS)
def test_model_runs_fedlag_and_fedrep_lag_from_a_dataset_of_its_kind(zoo_data, tmp_path, model, algorithm):
    k = "2" if algorithm == "FedRep+LAG" else "1"  # FedRep's head, plus one body layer
    code = main.main(["-data", dataset_of(model), "-m", model, "-algo", algorithm, "-nc", str(CLIENTS), "-gr", "1",
                      "-lbs", "8", "-dev", "cpu", "--threads", "1", "--lag_top_k", k,
                      "--data_dir", str(zoo_data), "--results_dir", str(tmp_path)])
    assert code == 0
    arrays, _ = read_results(tmp_path / f"{dataset_of(model)}_{algorithm}_test_0.h5")
    assert len(arrays["rs_test_acc"]) == 2 and np.isfinite(arrays["rs_train_loss"]).all()
    layers = [str(n.decode() if isinstance(n, bytes) else n) for n in arrays["lag_layer_names"]]
    modules = {name.rsplit(".", 1)[0] for name, _ in _split_model(model).named_parameters()}
    assert layers and set(layers) <= modules   # module granularity: layers are the model's modules
    if algorithm == "FedRep+LAG":
        assert all(name.startswith("base.") for name in layers)  # FedRep shares the body only
    else:
        assert any(name.startswith("head") for name in layers)


def _split_model(model: str):
    from flcore.trainmodel.models import split_head
    shape = SAMPLES[dataset_of(model)]
    options = {"vocab_size": VOCAB} if model in TEXT_MODELS else {}
    return split_head(build_model(model, shape, CLASSES, **options))


def test_every_model_of_the_zoo_is_covered_here_or_by_the_first_release():
    first_release = {"DNN", "MLR", "CNN", "ResNet9", "ResNet18", "ResNet20"}
    assert set(MODELS) == set(NEW_MODELS) | first_release | {"ResNet34"}


def test_a_text_model_on_images_is_refused_by_name(zoo_data, tmp_path, capsys):
    code = main.main(["-data", IMAGES, "-m", "LSTM", "-nc", str(CLIENTS), "-gr", "0", "-dev", "cpu",
                      "--data_dir", str(zoo_data), "--results_dir", str(tmp_path)])
    assert code == 2 and "model LSTM takes token ids, and Img holds image inputs" in capsys.readouterr().err
