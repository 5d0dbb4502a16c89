"""Every image model on every image shape it accepts; PFLlib's FedAvgCNN shapes; the head split by name.

Sensor, tabular and text models are tested in test_model_zoo.py.
"""
import pytest
import torch

from flcore.trainmodel.models import IMAGE_MODELS, UnknownModelError, build_model, split_head

SHAPES = [(1, 8, 8), (1, 28, 28), (3, 32, 32)]


@pytest.mark.parametrize("name", sorted(IMAGE_MODELS))
@pytest.mark.parametrize("shape", SHAPES)
def test_every_image_model_runs_on_every_image_shape_it_accepts(name, shape):
    minimum = getattr(IMAGE_MODELS[name], "MIN_INPUT", (1, 1, 1))
    if any(s < m for s, m in zip(shape, minimum)):  # e.g. LeNet on Digits' 8x8
        with pytest.raises(UnknownModelError, match=f"model {name} needs inputs of at least"):
            build_model(name, shape, 7)
        return
    model = build_model(name, shape, 7)
    out = model(torch.randn(2, *shape))
    assert out.shape == (2, 7)
    assert model.fc.out_features == 7


@pytest.mark.parametrize("shape,flat", [((1, 28, 28), 1024), ((3, 32, 32), 1600)])
def test_cnn_keeps_pfllib_layer_shapes_on_mnist_and_cifar(shape, flat):
    shapes = {n: tuple(p.shape) for n, p in build_model("CNN", shape, 10).named_parameters()}
    assert shapes == {"conv1.0.weight": (32, shape[0], 5, 5), "conv1.0.bias": (32,),
                      "conv2.0.weight": (64, 32, 5, 5), "conv2.0.bias": (64,),
                      "fc1.0.weight": (512, flat), "fc1.0.bias": (512,),
                      "fc.weight": (10, 512), "fc.bias": (10,)}


def test_head_split_moves_fc_into_head_and_keeps_the_function():
    torch.manual_seed(0)
    model = build_model("CNN", (1, 28, 28), 10)
    x = torch.randn(3, 1, 28, 28)
    expected = model(x)
    split = split_head(model)
    names = [n for n, _ in split.named_parameters()]
    assert names[-2:] == ["head.weight", "head.bias"] and all(n.startswith("base.") for n in names[:-2])
    assert torch.allclose(split(x), expected)


def test_resnets_have_batchnorm_buffers():
    buffers = dict(build_model("ResNet20", (3, 32, 32), 10).named_buffers())
    assert any(n.endswith("running_mean") for n in buffers)


def test_unknown_model_lists_valid_names():
    with pytest.raises(UnknownModelError, match="CNN, CNN-BN, ResNet9"):
        build_model("VGG", (1, 28, 28), 10)
