"""Models selectable with ``-m``, built from the dataset's input shape and class count.

Every model ends in a classifier named ``fc`` applied to a flat feature vector, so
:class:`BaseHeadSplit` can cut any of them into a feature extractor (``base``) and a head.
Models return logits; the loss applies the softmax (PFLlib's MLR/DNN apply ``log_softmax`` inside the
model, which after a head split lands on the features - that quirk is not reproduced).
"""
from __future__ import annotations

import copy
from typing import Callable, Dict, Sequence

import torch
from torch import nn

from flcore.trainmodel.resnet import InputShape, resnet9, resnet18, resnet20
from utils.errors import UserError


class BaseHeadSplit(nn.Module):
    """``head(base(x))``: PFLlib's split of a model into a shared body and a classifier head."""

    def __init__(self, base: nn.Module, head: nn.Module):
        super().__init__()
        self.base = base
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.base(x))


def split_head(model: nn.Module) -> BaseHeadSplit:
    """Move ``model.fc`` into a head and leave an identity in its place (as PFLlib's main.py does)."""
    head = copy.deepcopy(model.fc)
    model.fc = nn.Identity()
    return BaseHeadSplit(model, head)


class Mclr_Logistic(nn.Module):
    """Multinomial logistic regression: one linear layer on the flattened input."""

    def __init__(self, input_shape: InputShape, num_classes: int):
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(_numel(input_shape), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.flatten(x))


class DNN(nn.Module):
    """PFLlib's two-layer perceptron: input -> 100 -> classes."""

    def __init__(self, input_shape: InputShape, num_classes: int, hidden: int = 100):
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Sequential(nn.Linear(_numel(input_shape), hidden), nn.ReLU())
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.fc1(self.flatten(x)))


class FedAvgCNN(nn.Module):
    """PFLlib's FedAvgCNN: two 5x5 convolutions (32, 64 channels), each pooled, then 512 -> classes.

    On MNIST (1x28x28) and CIFAR (3x32x32) the layer shapes are PFLlib's (``fc1`` in = 1024 and 1600).
    Inputs smaller than 16 pixels (Digits' 8x8) would vanish under two unpadded 5x5 convolutions, so
    there the convolutions are padded to keep the spatial size. Pooling runs before the ReLU: the
    two commute exactly, and pooling first makes the ReLU four times cheaper.
    """

    SMALL_INPUT = 16

    def __init__(self, input_shape: InputShape, num_classes: int, hidden: int = 512):
        super().__init__()
        channels, height, width = input_shape
        pad = 2 if min(height, width) < self.SMALL_INPUT else 0
        self.conv1 = nn.Sequential(nn.Conv2d(channels, 32, 5, padding=pad), nn.MaxPool2d(2), nn.ReLU())
        self.conv2 = nn.Sequential(nn.Conv2d(32, 64, 5, padding=pad), nn.MaxPool2d(2), nn.ReLU())
        self.flatten = nn.Flatten()
        self.fc1 = nn.Sequential(nn.Linear(_flat_features(self._features, input_shape), hidden), nn.ReLU())
        self.fc = nn.Linear(hidden, num_classes)

    def _features(self, x: torch.Tensor) -> torch.Tensor:
        return self.flatten(self.conv2(self.conv1(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.fc1(self._features(x)))


ModelFactory = Callable[[InputShape, int], nn.Module]

MODELS: Dict[str, ModelFactory] = {
    "MLR": Mclr_Logistic,
    "DNN": DNN,
    "CNN": FedAvgCNN,
    "ResNet9": resnet9,
    "ResNet18": resnet18,
    "ResNet20": resnet20,
}

# Models whose convolutions run faster in channels-last memory format on CPU (about 1.4x in
# training and 2x in evaluation for FedAvgCNN); the format does not change the maths.
CONVOLUTIONAL = frozenset({"CNN", "ResNet9", "ResNet18", "ResNet20"})


class UnknownModelError(UserError, ValueError):
    pass


def build_model(name: str, input_shape: Sequence[int], num_classes: int) -> nn.Module:
    """Instantiate ``-m name`` for inputs of ``input_shape`` (C, H, W) and ``num_classes`` outputs."""
    if name not in MODELS:
        raise UnknownModelError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    shape = tuple(int(v) for v in input_shape)
    if len(shape) != 3:
        raise UnknownModelError(f"model {name} needs image inputs (C, H, W), got shape {shape}")
    model = MODELS[name](shape, num_classes)
    if name in CONVOLUTIONAL:
        model = model.to(memory_format=torch.channels_last)
    return model


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for v in shape:
        n *= v
    return n


def _flat_features(features: Callable[[torch.Tensor], torch.Tensor], input_shape: InputShape) -> int:
    with torch.no_grad():
        return features(torch.zeros(1, *input_shape)).shape[1]
