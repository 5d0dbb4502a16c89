"""Plain convolutional image classifiers from PFLlib's ``-m`` list: LeNet and a compact AlexNet.

Both take (C, H, W) images of any channel count and size down to a stated minimum, and end in a
classifier named ``fc`` on a flat feature vector. Pooling runs before each ReLU (the two commute, and
the ReLU then touches a quarter of the values), as in FedAvgCNN.
"""
from __future__ import annotations

import torch
from torch import nn

from flcore.trainmodel.errors import require_min_input
from flcore.trainmodel.resnet import InputShape
from flcore.trainmodel.shapes import flat_size


class LeNet(nn.Module):
    """LeNet-5 (LeCun et al., 1998): conv5x5(6)-pool-conv5x5(16)-pool, then 120 -> 84 -> ``fc``.

    The first convolution is padded, as usual for 28x28 digits, so MNIST gets LeNet-5's 16x5x5 = 400
    features (CIFAR's 32x32: 576); ReLU and max-pooling replace the original tanh and subsampling.
    Minimum input 12x12: two halvings around an unpadded 5x5 convolution leave nothing of smaller images.
    """

    MIN_INPUT = (1, 12, 12)

    def __init__(self, input_shape: InputShape, num_classes: int):
        super().__init__()
        require_min_input("LeNet", input_shape, self.MIN_INPUT, "two 2x2 poolings and an unpadded 5x5 convolution")
        self.conv1 = nn.Sequential(nn.Conv2d(input_shape[0], 6, 5, padding=2), nn.MaxPool2d(2), nn.ReLU())
        self.conv2 = nn.Sequential(nn.Conv2d(6, 16, 5), nn.MaxPool2d(2), nn.ReLU())
        self.flatten = nn.Flatten()
        self.fc1 = nn.Sequential(nn.Linear(flat_size(self._features, input_shape), 120), nn.ReLU())
        self.fc2 = nn.Sequential(nn.Linear(120, 84), nn.ReLU())
        self.fc = nn.Linear(84, num_classes)

    def _features(self, x: torch.Tensor) -> torch.Tensor:
        return self.flatten(self.conv2(self.conv1(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.fc2(self.fc1(self._features(x))))


class AlexNet(nn.Module):
    """A compact AlexNet for 32x32 and 64x64 images: AlexNet's five convolutions (64-192-384-256-256
    channels), here 3x3 at stride 1, with a 2x2 max-pool after the first, second and fifth; the maps
    average-pooled to 4x4; then dropout, 1024 -> 1024 and ``fc``.

    ImageNet AlexNet's 11x11 stride-4 stem and 3x3 stride-2 pools (PFLlib's copy of torchvision's)
    reduce a 32x32 image to nothing, and its 4096-wide layers hold 57M parameters; this keeps the
    layer pattern at 7.5M. On 32x32 the 4x4 pooling is an identity. Minimum input 8x8 (three halvings).
    """

    MIN_INPUT = (1, 8, 8)
    GRID = 4

    def __init__(self, input_shape: InputShape, num_classes: int, hidden: int = 1024, dropout: float = 0.5):
        super().__init__()
        require_min_input("AlexNet", input_shape, self.MIN_INPUT, "three 2x2 poolings")
        self.features = nn.Sequential(
            nn.Conv2d(input_shape[0], 64, 3, padding=1), nn.MaxPool2d(2), nn.ReLU(),
            nn.Conv2d(64, 192, 3, padding=1), nn.MaxPool2d(2), nn.ReLU(),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(),
            nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(),
            nn.Conv2d(256, 256, 3, padding=1), nn.MaxPool2d(2), nn.ReLU(),
            nn.AdaptiveAvgPool2d(self.GRID), nn.Flatten())
        self.fc1 = nn.Sequential(nn.Dropout(dropout), nn.Linear(256 * self.GRID ** 2, hidden), nn.ReLU())
        self.fc2 = nn.Sequential(nn.Dropout(dropout), nn.Linear(hidden, hidden), nn.ReLU())
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.fc2(self.fc1(self.features(x))))
