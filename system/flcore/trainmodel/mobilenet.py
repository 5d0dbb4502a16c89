"""MobileNetV2 (Sandler et al., 2018) with its inverted residual blocks, adapted to 32x32 images.

The blocks and the stage table (expansion t, channels c, repeats n, stride s) are the paper's. For
small images the stem convolution and the 24-channel stage run at stride 1 instead of 2 (as common
CIFAR ports do): the ImageNet strides, which PFLlib keeps, leave a 32x32 image 1x1 from the 160-channel
stage on. With three stride-2 stages a 32x32 image ends at 4x4. Padded stride-2 convolutions take any size.
"""
from __future__ import annotations

import torch
from torch import nn

from flcore.trainmodel.resnet import InputShape

# (expansion t, output channels c, blocks n, stride of the first block s), the paper's Table 2.
STAGES = ((1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def _conv_bn(c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1, relu: bool = True) -> nn.Sequential:
    layers = [nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, groups=groups, bias=False),
              nn.BatchNorm2d(c_out)]
    return nn.Sequential(*layers, nn.ReLU6()) if relu else nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    """1x1 expansion to ``t`` times the channels, 3x3 depthwise convolution, then a linear 1x1 projection
    (no ReLU: the narrow output would lose information to it); the input is added back when the block
    keeps the shape."""

    def __init__(self, c_in: int, c_out: int, stride: int, expansion: int):
        super().__init__()
        hidden = c_in * expansion
        expand = [_conv_bn(c_in, hidden, 1)] if expansion != 1 else []
        self.block = nn.Sequential(*expand, _conv_bn(hidden, hidden, 3, stride=stride, groups=hidden),
                                   _conv_bn(hidden, c_out, 1, relu=False))
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return x + out if self.residual else out


class MobileNet(nn.Module):
    """MobileNetV2: 32-channel stem, the inverted residual stages, a 1x1 convolution to 1280 channels,
    global average pooling, dropout and ``fc`` (2.2M parameters)."""

    def __init__(self, input_shape: InputShape, num_classes: int, last_channels: int = 1280, dropout: float = 0.2):
        super().__init__()
        self.stem = _conv_bn(input_shape[0], 32, 3)
        blocks, c_in = [], 32
        for expansion, c_out, count, stride in STAGES:
            for i in range(count):
                blocks.append(InvertedResidual(c_in, c_out, stride if i == 0 else 1, expansion))
                c_in = c_out
        self.layers = nn.Sequential(*blocks, _conv_bn(c_in, last_channels, 1))
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout))
        self.fc = nn.Linear(last_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.layers(self.stem(x))))
