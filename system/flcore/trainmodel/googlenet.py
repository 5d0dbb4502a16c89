"""A small Inception-v1 (GoogLeNet, Szegedy et al., 2015) for 32x32-class images.

PFLlib runs torchvision's ImageNet GoogLeNet (about 6M parameters, a stride-2 7x7 stem and three
downsamplings before the first Inception block). This keeps the design - parallel 1x1, 3x3, 5x5 and
pooled branches concatenated on channels, stages separated by stride-2 max-pools, global average
pooling, dropout and one linear classifier - with a 3x3 stride-1 stem, the branch widths of GoogLeNet's
blocks 3a, 3b, 4a, 4b and 5a halved, and 4c-4e and 5b left out (0.56M parameters). Every convolution
is followed by batch normalisation, as in torchvision's version. Padded pools let it take any size.
"""
from __future__ import annotations

import torch
from torch import nn

from flcore.trainmodel.resnet import InputShape


def _conv_bn_relu(c_in: int, c_out: int, kernel: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, kernel, padding=kernel // 2, bias=False),
                         nn.BatchNorm2d(c_out), nn.ReLU())


class Inception(nn.Module):
    """Four branches on the same input, concatenated: 1x1; 1x1 then 3x3; 1x1 then 5x5; 3x3 max-pool
    then 1x1. The 1x1 reductions keep the wide kernels cheap."""

    def __init__(self, c_in: int, c1: int, c3_reduce: int, c3: int, c5_reduce: int, c5: int, pool_proj: int):
        super().__init__()
        self.branch1 = _conv_bn_relu(c_in, c1, 1)
        self.branch3 = nn.Sequential(_conv_bn_relu(c_in, c3_reduce, 1), _conv_bn_relu(c3_reduce, c3, 3))
        self.branch5 = nn.Sequential(_conv_bn_relu(c_in, c5_reduce, 1), _conv_bn_relu(c5_reduce, c5, 5))
        self.branch_pool = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1), _conv_bn_relu(c_in, pool_proj, 1))
        self.out_channels = c1 + c3 + c5 + pool_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch1(x), self.branch3(x), self.branch5(x), self.branch_pool(x)], dim=1)


class GoogleNet(nn.Module):
    """Stem, Inception 3a-3b, pool, 4a-4b, pool, 5a, global average pooling, dropout and ``fc``."""

    def __init__(self, input_shape: InputShape, num_classes: int, dropout: float = 0.4):
        super().__init__()
        self.stem = _conv_bn_relu(input_shape[0], 64, 3)
        inception3 = [Inception(64, 32, 48, 64, 8, 16, 16), Inception(128, 64, 64, 96, 16, 48, 32)]
        inception4 = [Inception(240, 96, 48, 104, 8, 24, 32), Inception(256, 80, 56, 112, 12, 32, 32)]
        inception5 = [Inception(256, 128, 80, 160, 16, 64, 64)]
        # Padded stride-2 pools halve any size (rounding up), down to 1x1, so no input is too small.
        self.layers = nn.Sequential(*inception3, nn.MaxPool2d(3, stride=2, padding=1),
                                    *inception4, nn.MaxPool2d(3, stride=2, padding=1), *inception5)
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout))
        self.fc = nn.Linear(inception5[-1].out_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.layers(self.stem(x))))
