"""Models selectable with ``-m``, built from the dataset's input shape and class count.

Every model ends in a classifier named ``fc`` applied to a flat feature vector, so
:class:`BaseHeadSplit` can cut any of them into a feature extractor (``base``) and a head.
Models return logits; the loss applies the softmax (PFLlib's MLR/DNN apply ``log_softmax`` inside the
model, which after a head split lands on the features - that quirk is not reproduced).

Models come in four input kinds: images (C, H, W); sensor windows (C, 1, T); feature vectors (D,);
and token ids (max_len,), which also need the vocabulary size (-vs) and the longest length (-ml).
"""
from __future__ import annotations

import copy
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch
from torch import nn

from flcore.trainmodel import text
from flcore.trainmodel.errors import UnknownModelError
from flcore.trainmodel.googlenet import GoogleNet
from flcore.trainmodel.mobilenet import MobileNet
from flcore.trainmodel.resnet import InputShape, resnet9, resnet10, resnet18, resnet20, resnet34
from flcore.trainmodel.sensor import HARCNN
from flcore.trainmodel.shapes import flat_size
from flcore.trainmodel.tabular import AmazonMLP
from flcore.trainmodel.transformer import transformer
from flcore.trainmodel.vision import AlexNet, LeNet


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
    two commute exactly, and pooling first makes the ReLU four times cheaper. ``batch_norm`` adds the
    BatchNorm layers of :class:`FedAvgCNNBN`.
    """

    SMALL_INPUT = 16

    def __init__(self, input_shape: InputShape, num_classes: int, hidden: int = 512, batch_norm: bool = False):
        super().__init__()
        channels, height, width = input_shape
        pad = 2 if min(height, width) < self.SMALL_INPUT else 0
        self.conv1 = _conv_block(channels, 32, pad, batch_norm)
        self.conv2 = _conv_block(32, 64, pad, batch_norm)
        self.flatten = nn.Flatten()
        norm = [nn.BatchNorm1d(hidden)] if batch_norm else []
        self.fc1 = nn.Sequential(nn.Linear(_probed_in_eval(self, input_shape), hidden), *norm, nn.ReLU())
        self.fc = nn.Linear(hidden, num_classes)

    def _features(self, x: torch.Tensor) -> torch.Tensor:
        return self.flatten(self.conv2(self.conv1(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.fc1(self._features(x)))


class FedAvgCNNBN(FedAvgCNN):
    """FedAvgCNN with a BatchNorm after each convolution and after the hidden linear layer, where the CNN
    of FedBN's paper (Li et al., ICLR 2021) normalises: ``-m CNN-BN``, for FedBN on small images.

    Training normalises the hidden layer over the minibatch, so a batch needs two samples or more."""

    MIN_BATCH = 2

    def __init__(self, input_shape: InputShape, num_classes: int):
        super().__init__(input_shape, num_classes, batch_norm=True)


def _conv_block(in_channels: int, out_channels: int, pad: int, batch_norm: bool) -> nn.Sequential:
    """5x5 convolution [-> BatchNorm] -> 2x2 max-pool -> ReLU. The BatchNorm comes straight after the
    convolution: a negative scale does not commute with the max-pool."""
    norm = [nn.BatchNorm2d(out_channels)] if batch_norm else []
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, 5, padding=pad), *norm, nn.MaxPool2d(2), nn.ReLU())


def _probed_in_eval(model: FedAvgCNN, input_shape: InputShape) -> int:
    """:func:`flat_size` of the model's features, run in eval mode: the probe must not count as a batch of
    BatchNorm's running statistics (in eval mode it only reads them)."""
    model.eval()
    width = flat_size(model._features, input_shape)
    model.train()
    return width


ModelFactory = Callable[[InputShape, int], nn.Module]
TextModelFactory = Callable[..., nn.Module]  # (input_shape, num_classes, vocab_size, max_len)

IMAGE_MODELS: Dict[str, ModelFactory] = {
    "MLR": Mclr_Logistic,
    "DNN": DNN,
    "CNN": FedAvgCNN,
    "CNN-BN": FedAvgCNNBN,
    "ResNet9": resnet9,
    "ResNet10": resnet10,
    "ResNet18": resnet18,
    "ResNet20": resnet20,
    "ResNet34": resnet34,
    "LeNet": LeNet,
    "AlexNet": AlexNet,
    "GoogleNet": GoogleNet,
    "MobileNet": MobileNet,
}
SENSOR_MODELS: Dict[str, ModelFactory] = {"HARCNN": HARCNN}
VECTOR_MODELS: Dict[str, ModelFactory] = {"AmazonMLP": AmazonMLP}
TEXT_MODELS: Dict[str, TextModelFactory] = {
    "LSTM": text.lstm,
    "BiLSTM": text.bilstm,
    "fastText": text.fasttext,
    "TextCNN": text.text_cnn,
    "Transformer": transformer,
}

MODELS: Dict[str, Callable[..., nn.Module]] = {**IMAGE_MODELS, **SENSOR_MODELS, **VECTOR_MODELS, **TEXT_MODELS}

# Per kind: the models, the rank of one input, and how a refusal names that input.
INPUT_KINDS: Tuple[Tuple[Dict[str, Callable[..., nn.Module]], int, str], ...] = (
    (IMAGE_MODELS, 3, "image inputs (C, H, W)"),
    (SENSOR_MODELS, 3, "sensor windows (C, 1, T)"),
    (VECTOR_MODELS, 1, "feature vectors (D,)"),
    (TEXT_MODELS, 1, "token ids (max_len,)"),
)

# Models whose convolutions run faster in channels-last memory format on CPU (about 1.4x in
# training and 2x in evaluation for FedAvgCNN; 1.1x to 1.7x per training step for the other image
# models, GoogleNet gaining most); the format does not change the maths. Only 2-D image convolutions are
# listed: HARCNN convolves (C, 1, T) windows along one axis, and the other models have no 4-D weights.
CONVOLUTIONAL = frozenset({"CNN", "CNN-BN", "ResNet9", "ResNet10", "ResNet18", "ResNet20", "ResNet34",
                           "LeNet", "AlexNet", "GoogleNet", "MobileNet"})


def build_model(name: str, input_shape: Sequence[int], num_classes: int, *,
                vocab_size: Optional[int] = None, max_len: Optional[int] = None,
                feature_dim: int = text.FEATURE_DIM) -> nn.Module:
    """Instantiate ``-m name`` for inputs of ``input_shape`` and ``num_classes`` outputs.

    ``input_shape`` is one sample's shape, of the kind the model takes (see :data:`INPUT_KINDS`). Text
    models also need ``vocab_size`` (-vs); ``max_len`` (-ml) defaults to the sequence length and may
    not be shorter than it; ``feature_dim`` (-fd) is their embedding and feature width. Other models ignore
    all three.
    """
    if name not in MODELS:
        raise UnknownModelError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    shape = tuple(int(v) for v in input_shape)
    rank, form = next((rank, form) for group, rank, form in INPUT_KINDS if name in group)
    if len(shape) != rank:
        raise UnknownModelError(f"model {name} needs {form}, got shape {shape}")
    if name in TEXT_MODELS:
        if name == "Transformer" and feature_dim % 8:
            raise UnknownModelError(f"model Transformer splits -fd/--feature_dim over its 8 attention heads: "
                                    f"give a multiple of 8, got {feature_dim}")
        model = TEXT_MODELS[name](shape, num_classes, vocab_size=_vocab_size(name, vocab_size),
                                  max_len=_max_len(name, shape, max_len), width=int(feature_dim))
    else:
        model = MODELS[name](shape, num_classes)
    if name in CONVOLUTIONAL:
        model = model.to(memory_format=torch.channels_last)
    return model


def example_batch(name: str, input_shape: Sequence[int], batch_size: int = 2) -> torch.Tensor:
    """Zeros a model ``name`` can take: token ids (all padding) for text models, floats otherwise."""
    dtype = torch.int64 if name in TEXT_MODELS else torch.float32
    return torch.zeros(batch_size, *input_shape, dtype=dtype)


def _vocab_size(name: str, vocab_size: Optional[int]) -> int:
    if vocab_size is None:
        raise UnknownModelError(f"model {name} needs the vocabulary size: pass -vs/--vocab_size")
    if vocab_size < 2:
        raise UnknownModelError(f"model {name} needs -vs/--vocab_size >= 2 (the padding id 0 and at least one "
                                f"token), got {vocab_size}")
    return int(vocab_size)


def _max_len(name: str, shape: Tuple[int, ...], max_len: Optional[int]) -> int:
    if max_len is None:
        return shape[0]
    if max_len < shape[0]:
        raise UnknownModelError(f"model {name}: the dataset's sequences have {shape[0]} tokens, more than "
                                f"-ml/--max_len {max_len}; raise -ml to at least {shape[0]}")
    return int(max_len)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for v in shape:
        n *= v
    return n
