"""Residual networks with a CIFAR-style stem (3x3 convolution, stride 1, no max-pool).

PFLlib only offers torchvision's ImageNet stem, which shrinks a 32x32 image to 8x8 before the
first block. These networks keep the resolution and end in global pooling, so they run on any
image size down to Digits' 8x8. Each ends in a classifier named ``fc``.

* ``resnet9``  - the DAWNBench/Myrtle ResNet-9 (64-128-256-512 channels, 6.6M parameters);
* ``resnet10`` - ResNet-18's stages with one BasicBlock each [1, 1, 1, 1] (4.9M; PFLlib's ResNet10 layout);
* ``resnet18`` - He et al.'s ResNet-18 with BasicBlocks [2, 2, 2, 2] (11.2M parameters);
* ``resnet20`` - He et al.'s CIFAR ResNet-20, three stages of three blocks, 16-32-64 (0.27M);
* ``resnet34`` - He et al.'s ResNet-34 with BasicBlocks [3, 4, 6, 3] (21.3M).
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch
from torch import nn

InputShape = Tuple[int, int, int]  # channels, height, width


def _conv_bn(c_in: int, c_out: int, stride: int = 1) -> List[nn.Module]:
    return [nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(c_out)]


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with an identity (or 1x1 projection) shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(c_in, c_out, stride)
        self.conv2, self.bn2 = _conv_bn(c_out, c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """Stem, stages of BasicBlocks (the first block of each later stage halves the resolution),
    global average pooling and ``fc``."""

    def __init__(self, in_channels: int, num_classes: int, widths: Sequence[int], blocks: Sequence[int]):
        super().__init__()
        stem_conv, stem_bn = _conv_bn(in_channels, widths[0])
        self.stem = nn.Sequential(stem_conv, stem_bn, nn.ReLU())
        stages = []
        c_in = widths[0]
        for i, (width, count) in enumerate(zip(widths, blocks)):
            stride = 1 if i == 0 else 2
            layers = [BasicBlock(c_in, width, stride)] + [BasicBlock(width, width) for _ in range(count - 1)]
            stages.append(nn.Sequential(*layers))
            c_in = width
        self.layers = nn.Sequential(*stages)
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.layers(self.stem(x))))


class _Residual(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.inner(x)


def _conv_bn_relu(c_in: int, c_out: int, pool: bool = False) -> nn.Sequential:
    conv, bn = _conv_bn(c_in, c_out)
    # Max-pool before the ReLU: the two commute, and the ReLU then touches a quarter of the values.
    layers = [conv, bn, nn.MaxPool2d(2), nn.ReLU()] if pool else [conv, bn, nn.ReLU()]
    return nn.Sequential(*layers)


class ResNet9(nn.Module):
    """Myrtle's ResNet-9: prep, (conv+pool, residual), conv+pool, (conv+pool, residual), max-pool, fc."""

    def __init__(self, in_channels: int, num_classes: int):
        super().__init__()
        self.prep = _conv_bn_relu(in_channels, 64)
        self.layer1 = nn.Sequential(_conv_bn_relu(64, 128, pool=True),
                                    _Residual(nn.Sequential(_conv_bn_relu(128, 128), _conv_bn_relu(128, 128))))
        self.layer2 = _conv_bn_relu(128, 256, pool=True)
        self.layer3 = nn.Sequential(_conv_bn_relu(256, 512, pool=True),
                                    _Residual(nn.Sequential(_conv_bn_relu(512, 512), _conv_bn_relu(512, 512))))
        self.pool = nn.Sequential(nn.AdaptiveMaxPool2d(1), nn.Flatten())
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.layer3(self.layer2(self.layer1(self.prep(x))))))


def resnet9(input_shape: InputShape, num_classes: int) -> nn.Module:
    return ResNet9(input_shape[0], num_classes)


def resnet10(input_shape: InputShape, num_classes: int) -> nn.Module:
    return ResNet(input_shape[0], num_classes, widths=(64, 128, 256, 512), blocks=(1, 1, 1, 1))


def resnet18(input_shape: InputShape, num_classes: int) -> nn.Module:
    return ResNet(input_shape[0], num_classes, widths=(64, 128, 256, 512), blocks=(2, 2, 2, 2))


def resnet20(input_shape: InputShape, num_classes: int) -> nn.Module:
    return ResNet(input_shape[0], num_classes, widths=(16, 32, 64), blocks=(3, 3, 3))


def resnet34(input_shape: InputShape, num_classes: int) -> nn.Module:
    return ResNet(input_shape[0], num_classes, widths=(64, 128, 256, 512), blocks=(3, 4, 6, 3))
