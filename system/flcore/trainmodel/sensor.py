"""HARCNN: PFLlib's convolutional net for inertial-sensor windows (HAR, PAMAP2).

PFLlib stores a window as (channels, 1, steps) - HAR: 9 signals x 1 x 128 steps; PAMAP2: 9 x 1 x 256 -
and convolves along the steps only, with (1x9) kernels. The network follows Jindong Wang's
activity-recognition CNN, which PFLlib adopted.
"""
from __future__ import annotations

import torch
from torch import nn

from flcore.trainmodel.errors import require_min_input
from flcore.trainmodel.resnet import InputShape
from flcore.trainmodel.shapes import flat_size


class HARCNN(nn.Module):
    """Two (1x9) convolutions (32, 64 channels), each followed by a (1x2) max-pool, then 1024 -> 512 ->
    ``fc``. On HAR the flat features are PFLlib's 64 x 26 = 1664 (PAMAP2: 64 x 58 = 3712).

    PFLlib names its whole three-layer MLP ``fc``, so there a head split makes all of it the head; here
    ``fc`` is the last linear layer only, as in every other model, and ``fc1``/``fc2`` belong to the base.
    Minimum input 28 steps: two unpadded 9-step convolutions, each followed by a halving.
    """

    MIN_INPUT = (1, 1, 28)
    KERNEL = (1, 9)
    POOL = (1, 2)

    def __init__(self, input_shape: InputShape, num_classes: int):
        super().__init__()
        require_min_input("HARCNN", input_shape, self.MIN_INPUT, "two unpadded 1x9 convolutions and two 1x2 poolings")
        self.conv1 = nn.Sequential(nn.Conv2d(input_shape[0], 32, self.KERNEL), nn.MaxPool2d(self.POOL), nn.ReLU())
        self.conv2 = nn.Sequential(nn.Conv2d(32, 64, self.KERNEL), nn.MaxPool2d(self.POOL), nn.ReLU())
        self.flatten = nn.Flatten()
        self.fc1 = nn.Sequential(nn.Linear(flat_size(self._features, input_shape), 1024), nn.ReLU())
        self.fc2 = nn.Sequential(nn.Linear(1024, 512), nn.ReLU())
        self.fc = nn.Linear(512, num_classes)

    def _features(self, x: torch.Tensor) -> torch.Tensor:
        return self.flatten(self.conv2(self.conv1(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.fc2(self.fc1(self._features(x))))
