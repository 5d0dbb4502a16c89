"""Evaluation arithmetic: per-client counts in, PFLlib's reported numbers out."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import torch


@dataclass(frozen=True)
class ClientTestStats:
    correct: int
    num_samples: int
    auc: float  # micro-averaged one-vs-rest ROC-AUC on this client's test set


@dataclass(frozen=True)
class ClientEvaluation:
    """One client's share of an evaluation: its test statistics and its train loss, summed."""
    test: ClientTestStats
    train_loss_sum: float
    train_samples: int


@dataclass(frozen=True)
class Summary:
    accuracy: float      # sum(correct) / sum(n): sample-weighted mean over all clients
    auc: float           # per-client AUC weighted by test samples
    train_loss: float    # sum(loss * n) / sum(n) over train sets
    accuracy_std: float  # unweighted std of per-client accuracies (PFLlib's "Std")
    client_accuracy: np.ndarray


def test_stats(logits: torch.Tensor, labels: torch.Tensor) -> ClientTestStats:
    """A client's accuracy count and AUC from its model's outputs on its test set."""
    correct = int((logits.argmax(dim=1) == labels).sum())
    return ClientTestStats(correct, len(labels), micro_auc(logits, labels, logits.shape[1]))


def summarize(test: Sequence[ClientTestStats], train_loss_sums: Sequence[float],
              train_samples: Sequence[int]) -> Summary:
    """PFLlib's evaluation formula (PFLLIB.md section 6) over every client."""
    correct = np.array([s.correct for s in test], dtype=np.float64)
    n = np.array([s.num_samples for s in test], dtype=np.float64)
    auc = np.array([s.auc for s in test], dtype=np.float64)
    per_client = np.divide(correct, n, out=np.zeros_like(correct), where=n > 0)
    total_train = float(sum(train_samples))
    return Summary(
        accuracy=float(correct.sum() / n.sum()),
        auc=float((auc * n).sum() / n.sum()),
        train_loss=float(sum(train_loss_sums) / total_train) if total_train else float("nan"),
        accuracy_std=float(per_client.std()),
        client_accuracy=per_client,
    )


def validation_accuracy(clients: Sequence, model_of: Optional[Callable] = None) -> float:
    """Sample-weighted accuracy over the clients' validation sets (``--val_ratio``), of each client's
    evaluation model or of ``model_of(client)``."""
    stats = [c.test_metrics(c.val_data, None if model_of is None else model_of(c))
             for c in clients if c.val_data is not None]
    total = sum(s.num_samples for s in stats)
    return sum(s.correct for s in stats) / total if total else float("nan")


def micro_auc(logits: torch.Tensor, labels: torch.Tensor, num_classes: int) -> float:
    """Micro-averaged one-vs-rest ROC-AUC of softmax scores (sklearn's ``average='micro'``).

    All (sample, class) scores are pooled and ranked once: AUC is the Mann-Whitney statistic
    ``(sum of positive ranks - P(P+1)/2) / (P N)`` with tied scores sharing their average rank.
    """
    probs = torch.softmax(logits.float(), dim=1).cpu().numpy().ravel()
    positive = np.eye(num_classes, dtype=bool)[labels.cpu().numpy()].ravel()
    n_pos = int(positive.sum())
    n_neg = positive.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((_average_ranks(probs)[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of ``values``; equal values get the mean of the ranks they span."""
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    starts_group = np.r_[True, ordered[1:] != ordered[:-1]]
    starts = np.flatnonzero(starts_group)
    ends = np.r_[starts[1:], len(values)]
    ranks = np.empty(len(values))
    ranks[order] = ((starts + 1 + ends) / 2)[np.cumsum(starts_group) - 1]
    return ranks
