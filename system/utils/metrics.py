"""Evaluation arithmetic: per-client counts in, PFLlib's reported numbers out."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from sklearn.metrics import roc_auc_score


@dataclass(frozen=True)
class ClientTestStats:
    correct: int
    num_samples: int
    auc: float  # micro-averaged one-vs-rest ROC-AUC on this client's test set


@dataclass(frozen=True)
class Summary:
    accuracy: float      # sum(correct) / sum(n): sample-weighted mean over all clients
    auc: float           # per-client AUC weighted by test samples
    train_loss: float    # sum(loss * n) / sum(n) over train sets
    accuracy_std: float  # unweighted std of per-client accuracies (PFLlib's "Std")
    client_accuracy: np.ndarray


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


def micro_auc(logits: torch.Tensor, labels: torch.Tensor, num_classes: int) -> float:
    """Micro-averaged one-vs-rest ROC-AUC of softmax scores (sklearn's ``average='micro'``)."""
    probs = torch.softmax(logits.float(), dim=1).cpu().numpy()
    onehot = np.eye(num_classes, dtype=np.int8)[labels.cpu().numpy()]
    return float(roc_auc_score(onehot.ravel(), probs.ravel()))
