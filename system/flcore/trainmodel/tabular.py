"""AmazonMLP: PFLlib's perceptron for the Amazon Review data's 5000-d feature vectors."""
from __future__ import annotations

from typing import Tuple

import torch
from torch import nn


class AmazonMLP(nn.Module):
    """Inputs of shape (D,) (5000 for Amazon Review) -> 1000 -> 500 -> 100 -> ``fc``, ReLU between.

    PFLlib fixes D = 5000 and two classes; here both come from the dataset.
    """

    WIDTHS = (1000, 500, 100)

    def __init__(self, input_shape: Tuple[int], num_classes: int):
        super().__init__()
        layers, width = [], input_shape[0]
        for out in self.WIDTHS:
            layers += [nn.Linear(width, out), nn.ReLU()]
            width = out
        self.encoder = nn.Sequential(*layers)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.encoder(x))
