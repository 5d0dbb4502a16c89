"""Text classifiers from PFLlib's ``-m`` list: LSTM, BiLSTM, fastText and TextCNN.

Inputs are int64 token ids of shape (batch, max_len), right-padded with id 0 (see ``tokens.py``);
PFLlib passes ``(ids, lengths)`` pairs instead, here the lengths are read off the padding. Every model
embeds tokens in ``-fd/--feature_dim`` dimensions (default ``FEATURE_DIM``, PFLlib's), the padding row
zero and untrained, and ends in a classifier ``fc`` on a flat feature vector. They return logits: PFLlib's ``log_softmax``
after ``fc`` would land on the features after a head split. The Transformer is in ``transformer.py``.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from flcore.trainmodel.errors import require_min_input
from flcore.trainmodel.tokens import PAD, real_positions, sequence_lengths

FEATURE_DIM = 512


def _packed(embedded: torch.Tensor, lengths: torch.Tensor) -> nn.utils.rnn.PackedSequence:
    # Packing makes the recurrence stop at each sequence's last token, so trailing padding never
    # reaches the final states (the backward direction of a BiLSTM would otherwise start on padding).
    return pack_padded_sequence(embedded, lengths.cpu(), batch_first=True, enforce_sorted=False)


class LSTM(nn.Module):
    """PFLlib's LSTMNet: embedding, a two-layer LSTM (dropout 0.2 between layers and before ``fc``), and
    the last layer's hidden state at each sequence's final real token.

    PFLlib reads the state at the last padded position, which is zeros for every sequence shorter
    than the longest in its batch; the final state of the packed sequence is used instead.
    """

    def __init__(self, vocab_size: int, num_classes: int, width: int = FEATURE_DIM, layers: int = 2,
                 dropout: float = 0.2):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, width, padding_idx=PAD)
        self.lstm = nn.LSTM(width, width, num_layers=layers, dropout=dropout, batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        _, (hidden, _) = self.lstm(_packed(self.embedding(tokens), sequence_lengths(tokens)))
        return self.fc(self.dropout(hidden[-1]))


class BiLSTM(nn.Module):
    """Bidirectional LSTM with Luong (dot-product) attention, after FedNLP's model that PFLlib copies.

    The sentence state is the forward direction's state at the last real token joined to the backward
    direction's at the first; it scores every real position's output, and the softmax-weighted sum of
    outputs (the context) joined to the state goes through ``fc1`` = tanh(W [context; state]) and ``fc``.
    In PFLlib's copy the attention is optional and the initial states are created on CUDA; here the
    attention is always on and the states are the LSTM's own zeros, on the model's device.
    """

    def __init__(self, vocab_size: int, num_classes: int, width: int = FEATURE_DIM, dropout: float = 0.2):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, width, padding_idx=PAD)
        self.lstm = nn.LSTM(width, width, batch_first=True, bidirectional=True)
        self.dropout = nn.Dropout(dropout)
        self.fc1 = nn.Sequential(nn.Linear(4 * width, width), nn.Tanh())
        self.fc = nn.Linear(width, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        packed, (hidden, _) = self.lstm(_packed(self.embedding(tokens), sequence_lengths(tokens)))
        outputs, _ = pad_packed_sequence(packed, batch_first=True, total_length=tokens.shape[1])
        state = self.dropout(torch.cat([hidden[0], hidden[1]], dim=1))
        scores = torch.bmm(outputs, state.unsqueeze(2)).squeeze(2)
        weights = torch.softmax(scores.masked_fill(~real_positions(tokens), float("-inf")), dim=1)
        context = torch.bmm(weights.unsqueeze(1), outputs).squeeze(1)
        return self.fc(self.fc1(torch.cat([context, state], dim=1)))


class FastText(nn.Module):
    """fastText (Joulin et al., 2017) as PFLlib has it: the mean embedding of the real tokens, a linear
    layer ``fc1`` and ``fc`` (no non-linearity: the model is linear in the mean embedding).

    PFLlib averages over all positions, padding included, which shrinks short texts' features; here
    the mean is over the real tokens."""

    def __init__(self, vocab_size: int, num_classes: int, width: int = FEATURE_DIM):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, width, padding_idx=PAD)
        self.fc1 = nn.Linear(width, width)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        real = real_positions(tokens).unsqueeze(2)
        mean = (self.embedding(tokens) * real).sum(dim=1) / real.sum(dim=1)
        return self.fc(self.fc1(mean))


class TextCNN(nn.Module):
    """TextCNN (Kim, 2014): parallel 1-D convolutions of widths 3, 4 and 5 (100 filters each) over the
    embedded sequence, each max-pooled over all positions, concatenated, dropout and ``fc``.

    PFLlib sizes its pools from ``-ml``; a global max takes any length at least the widest kernel.
    Dropout is Kim's 0.5 (PFLlib's 0.8 drops most of the 300 features).
    """

    KERNELS = (3, 4, 5)

    def __init__(self, vocab_size: int, seq_len: int, num_classes: int, width: int = FEATURE_DIM,
                 filters: int = 100, dropout: float = 0.5):
        super().__init__()
        require_min_input("TextCNN", (seq_len,), (max(self.KERNELS),), "its widest convolution spans 5 tokens")
        self.embedding = nn.Embedding(vocab_size, width, padding_idx=PAD)
        self.convs = nn.ModuleList(nn.Conv1d(width, filters, k) for k in self.KERNELS)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(filters * len(self.KERNELS), num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        channels_first = self.embedding(tokens).transpose(1, 2)
        # Max over positions before the ReLU: the two commute, and the ReLU then sees one value per filter.
        pooled = [torch.relu(conv(channels_first).amax(dim=2)) for conv in self.convs]
        return self.fc(self.dropout(torch.cat(pooled, dim=1)))


# Builders with one signature for ``models.build_model``: the sequence shape (max_len,), the class
# count, the vocabulary size (-vs), the longest sequence the model must take (-ml) and the width (-fd).

def lstm(input_shape: Sequence[int], num_classes: int, vocab_size: int, max_len: int,
         width: int = FEATURE_DIM) -> nn.Module:
    return LSTM(vocab_size, num_classes, width=width)


def bilstm(input_shape: Sequence[int], num_classes: int, vocab_size: int, max_len: int,
           width: int = FEATURE_DIM) -> nn.Module:
    return BiLSTM(vocab_size, num_classes, width=width)


def fasttext(input_shape: Sequence[int], num_classes: int, vocab_size: int, max_len: int,
             width: int = FEATURE_DIM) -> nn.Module:
    return FastText(vocab_size, num_classes, width=width)


def text_cnn(input_shape: Sequence[int], num_classes: int, vocab_size: int, max_len: int,
             width: int = FEATURE_DIM) -> nn.Module:
    return TextCNN(vocab_size, input_shape[0], num_classes, width=width)
