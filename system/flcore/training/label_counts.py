"""Per-class sample counts of a client's training labels.

FedROD shifts its logits by the log of these counts (balanced softmax) and GPFL weights its class
embeddings by their proportions. They are counted over every training label, once: PFLlib counts
them from a shuffled ``drop_last`` loader, which silently leaves out the samples of the last
incomplete batch.
"""
from __future__ import annotations

import torch


def class_counts(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``counts[c]`` = number of labels equal to ``c``, as floats on the labels' device."""
    return torch.bincount(labels.reshape(-1), minlength=num_classes)[:num_classes].float()


def class_proportions(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """The empirical label distribution (sums to 1; all zeros for an empty label set)."""
    counts = class_counts(labels, num_classes)
    total = counts.sum()
    return counts / total if total > 0 else counts
