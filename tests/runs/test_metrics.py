"""The evaluation formula (PFLLIB.md section 6) and the AUC."""
import numpy as np
import torch
from sklearn.metrics import roc_auc_score
from sklearn.preprocessing import label_binarize

from utils.metrics import ClientTestStats, micro_auc, summarize


def test_summary_is_sample_weighted_over_all_clients():
    test = [ClientTestStats(correct=9, num_samples=10, auc=0.9), ClientTestStats(correct=10, num_samples=40, auc=0.5)]
    s = summarize(test, train_loss_sums=[30.0, 10.0], train_samples=[30, 70])
    assert s.accuracy == 19 / 50                      # not the mean of 0.9 and 0.25
    assert np.isclose(s.auc, (0.9 * 10 + 0.5 * 40) / 50)
    assert np.isclose(s.train_loss, 40 / 100)
    assert np.isclose(s.accuracy_std, np.std([0.9, 0.25]))
    assert np.allclose(s.client_accuracy, [0.9, 0.25])


def test_micro_auc_equals_sklearn_micro_average():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(40, 4, generator=g)
    labels = torch.randint(0, 4, (40,), generator=g)
    probs = torch.softmax(logits, 1).numpy()
    expected = roc_auc_score(label_binarize(labels.numpy(), classes=range(4)), probs, average="micro")
    assert np.isclose(micro_auc(logits, labels, 4), expected)


def test_micro_auc_handles_tied_scores_like_sklearn():
    logits = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [2.0, 0.0, 2.0], [0.0, 1.0, 1.0]])
    labels = torch.tensor([0, 1, 2, 2])
    probs = torch.softmax(logits, 1).numpy()
    expected = roc_auc_score(label_binarize(labels.numpy(), classes=range(3)), probs, average="micro")
    assert np.isclose(micro_auc(logits, labels, 3), expected)


def test_micro_auc_of_a_perfect_classifier_is_one():
    labels = torch.tensor([0, 1, 2, 1])
    assert micro_auc(torch.eye(3)[labels] * 10, labels, 3) == 1.0
