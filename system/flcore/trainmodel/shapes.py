"""Shape arithmetic shared by the models: the width of a feature extractor's flat output, and the
width of the features a classifier head reads."""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn


def flat_size(features: Callable[[torch.Tensor], torch.Tensor], input_shape: Sequence[int]) -> int:
    """Features per sample that ``features`` makes of one input of ``input_shape``, found by running
    it once on zeros, so no layer has to repeat the convolution and pooling arithmetic by hand."""
    with torch.no_grad():
        return features(torch.zeros(1, *input_shape)).flatten(1).shape[1]


def head_in_features(head: nn.Module) -> int:
    """Width of the feature vector the head classifies (every model's classifier is a Linear)."""
    if not isinstance(head, nn.Linear):
        raise TypeError(f"expected a linear classifier head, got {type(head).__name__}")
    return head.in_features
